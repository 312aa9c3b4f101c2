"""The lessons as files: each learner's own copy, which cells are exercises, and the instructor's
key. Introduced in the README (`allreduce-edu lessons`).

`allreduce-edu lessons DIR` copies the lessons that ship inside the package into DIR and never
overwrites one the learner has changed (copies.py). An exercise cell carries `"exercise": "03.1"`
in its metadata; in the shipped lessons it is a scaffold, and `solved(nb)` puts each exercise's
`key` in its place (key.py).
"""

from .copies import CopyReport, _digest, as_delivered, copy_lessons
from .files import (
                    DEFAULT_FOLDER,
                    ENV_DATA,
                    KEY,
                    MANIFEST,
                    example_file,
                    exercise_cells,
                    lesson_files,
                    read,
                    set_source,
                    source,
                    source_folder,
                    write,
)
from .key import errors, execute, feedback, passed_or_needs_extra, solved, write_solved

__all__ = ["CopyReport", "DEFAULT_FOLDER", "ENV_DATA", "KEY", "MANIFEST", "_digest",
           "as_delivered", "copy_lessons", "errors", "example_file", "exercise_cells", "execute",
           "feedback", "lesson_files", "passed_or_needs_extra", "read", "set_source", "solved",
           "source", "source_folder", "write", "write_solved"]
