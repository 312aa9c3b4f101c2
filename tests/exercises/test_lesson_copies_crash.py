"""A learner's lessons survive an interrupted copy (issue 37's fourth case: a truncated lesson was
then 'left alone (you changed them)' for ever): copies are written whole or not at all, and a file
that is not a notebook at a lesson's path is repaired; a learner's own valid changes still never are."""

from __future__ import annotations

import json

from allreduce_edu import course


def test_a_lesson_cut_short_is_repaired_and_a_changed_one_is_still_left_alone(tmp_path, monkeypatch):
    monkeypatch.setattr(course.copies, "_trust", lambda paths: None)  # no signature store needed
    first = course.copy_lessons(tmp_path)
    names = sorted(first.added)
    cut, changed = tmp_path / names[0], tmp_path / names[1]
    cut.write_bytes(cut.read_bytes()[:1000])  # a copy interrupted half way (disk full, Ctrl-C)
    nb = json.loads(changed.read_text())
    nb["cells"][0]["source"] = ["my own notes\n"]
    changed.write_text(json.dumps(nb))
    again = course.copy_lessons(tmp_path)
    assert again.repaired == [cut.name] and changed.name in again.kept
    assert json.loads(cut.read_text())["cells"]  # a whole notebook again
    assert json.loads(changed.read_text())["cells"][0]["source"] == ["my own notes\n"]
    assert "repaired" in str(again)
    assert not list(tmp_path.glob(".*.tmp"))  # no scratch file left beside them


def test_a_copy_interrupted_while_writing_leaves_no_half_lesson(tmp_path, monkeypatch):
    monkeypatch.setattr(course.copies, "_trust", lambda paths: None)
    real = course.copies.Path.write_bytes
    calls = []

    def disk_full(self, data):
        calls.append(self)
        if len(calls) == 3:  # the third file: half written, then the disk is full
            real(self, data[:len(data) // 2])
            raise OSError(28, "No space left on device")
        return real(self, data)

    monkeypatch.setattr(course.copies.Path, "write_bytes", disk_full)
    try:
        course.copy_lessons(tmp_path)
    except OSError:
        pass
    monkeypatch.setattr(course.copies.Path, "write_bytes", real)
    for path in tmp_path.glob("*.ipynb"):  # whatever is there is a whole lesson
        assert json.loads(path.read_text())["cells"]
    assert not list(tmp_path.glob(".*.tmp"))
