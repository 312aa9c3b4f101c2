"""Checkers for the lessons' exercises: they run your answer (on real ranks when it is a collective)
and reply with the first concrete thing that is wrong, and a hint.

    hint("03.1")        # the next hint for exercise 03.1 (call again for the one after)
    solution("03.1")    # an answer, when you want it
    progress()          # every exercise of the course: passed, attempted, not started
    record_prediction("03.a", 3.5)   # your guess, before a cell measures it

One module per lesson: `from allreduce_edu.exercises.lesson03 import check_ring_allreduce`.
"""

from .feedback import Feedback
from .lesson00 import check_average, check_welcome_prediction
from .lesson01 import check_echo, check_prediction, check_small_message_answer
from .predictions import compare_prediction, record_prediction
from .registry import (
    EXERCISES,
    all_exercises,
    hint,
    learner_or_reference,
    progress,
    reference,
    solution,
)

__all__ = ["Feedback", "hint", "solution", "progress", "record_prediction", "compare_prediction",
           "reference", "learner_or_reference",
           "EXERCISES", "all_exercises", "check_welcome_prediction", "check_average",
           "check_prediction", "check_echo", "check_small_message_answer"]
