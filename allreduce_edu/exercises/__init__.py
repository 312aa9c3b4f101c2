"""Checkers for the lessons' exercises: they run your answer (on real ranks when it is a collective)
and reply with the first concrete thing that is wrong, and a hint. `solution("03.1")` shows an answer.

One module per lesson: `from allreduce_edu.exercises.lesson03 import check_ring_allreduce`.
"""

from ._feedback import Feedback, solution
from .lesson00 import check_max_allreduce, check_welcome_prediction
from .lesson01 import check_echo, check_prediction, check_small_message_answer

__all__ = ["Feedback", "solution", "check_welcome_prediction", "check_max_allreduce", "check_prediction",
           "check_echo", "check_small_message_answer"]
