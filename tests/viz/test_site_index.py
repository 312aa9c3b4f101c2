"""The site's index lists each lesson's objectives and time, read from the lesson's own header; each
page links to the previous and next lesson and to the index; a lesson without objectives stops the
build. No notebook is executed here; the pages built are tiny synthetic lessons."""

from __future__ import annotations

import html
import re

import nbformat
import pytest

from allreduce_edu import course
from allreduce_edu.course import site_index
from allreduce_edu.course.site import build_site, write_index

HEADER = """# {title}

**You will learn**
- the first idea, with `code` and **bold**;
- the second idea, wrapped
  onto a second line.

**You need** nothing. **Time**: about {minutes} minutes (the cells run in about 2 minutes).
"""


def _plain(markup: str) -> str:
    """Text as a reader sees it: no tags or markdown marks, entities decoded, spaces collapsed."""
    text = html.unescape(re.sub(r"<[^>]+>", "", markup))
    return " ".join(text.replace("`", "").replace("**", "").replace("*", "").split())


def _header(path) -> str:
    nb = nbformat.read(path, as_version=4)
    return next(c.source for c in nb.cells if c.cell_type == "markdown")


def _lesson_folder(folder, headers: dict[str, str]):
    folder.mkdir()
    for name, header in headers.items():
        cells = [nbformat.v4.new_markdown_cell(header), nbformat.v4.new_code_cell("x = 1")]
        nbformat.write(nbformat.v4.new_notebook(cells=cells), folder / f"{name}.ipynb")
    return folder


def test_the_index_has_every_lessons_objectives_and_time(tmp_path):
    paths = course.lesson_files()
    lessons = [site_index.lesson(nbformat.read(p, as_version=4), p) for p in paths]
    index = write_index(tmp_path, lessons).read_text()
    items = index.split('<li class="lesson">')[1:]
    assert [re.search(r'href="([^"]+)"', item)[1] for item in items] == [f"{p.stem}.html"
                                                                         for p in paths]
    for path, item in zip(paths, items, strict=True):
        header = " ".join(_header(path).split())
        # what the notebook says, read here without the site's parser: the bullets between
        # "**You will learn**" and "**You need**", and the first "about N minutes"
        learn = header.split("**You will learn**")[1].split("**You need**")[0]
        bullets = [b.strip() for b in learn.split(" - ") if b.strip(" -")]
        assert len(bullets) >= 3, path.name
        shown = _plain(item)
        for bullet in bullets:
            assert _plain(bullet.lstrip("- ")) in shown, f"{path.name}: {bullet!r} not in the index"
        minutes = re.search(r"[Aa]bout (\d+) minutes", header)[1]
        assert f"({minutes} min)" in shown, path.name
        title = next(line[2:] for line in _header(path).splitlines() if line.startswith("# "))
        assert _plain(title) in shown


@pytest.mark.parametrize("header, objectives, time", [
    (HEADER.format(title="t", minutes=20),
     ("the first idea, with `code` and **bold**;", "the second idea, wrapped onto a second line."),
     "20 min"),
    ("# t\n\nBy the end of this lesson you can:\n\n1. do one thing\n2. do another\n\n~40 min",
     ("do one thing", "do another"), "40 min"),
    ("# t\n\nYou will need lesson 02.\n\n**You will learn**\n* a\n* b\n\nThe cells run in about 2 "
     "minutes. About 30–40 minutes for you.", ("a", "b"), "30–40 min"),
    ("# t\n\n**Learning objectives**\n- a\n\n**Time:** 25 min", ("a",), "25 min"),
])
def test_a_header_s_objectives_and_time_are_read_in_the_forms_lessons_use(header, objectives,
                                                                        time):
    assert site_index.header_objectives(header) == objectives
    assert site_index.header_time(header) == time


def test_an_objective_s_markdown_is_shown_as_html_and_nothing_else_is_markup():
    shown = site_index.inline("how `a<b` and **bold** and *em* work, 2*3*4 <script>")
    assert shown == ("how <code>a&lt;b</code> and <strong>bold</strong> and <em>em</em> work, "
                     "2*3*4 &lt;script&gt;")


def test_each_page_links_the_previous_the_next_and_the_index(tmp_path):
    names = ["00_first", "01_second", "02_third"]
    source = _lesson_folder(tmp_path / "lessons", {
        name: HEADER.format(title=f"Lesson {name[:2]}", minutes=10 + i)
        for i, name in enumerate(names)})
    index = build_site(tmp_path / "site", source=source)
    pages = [f"{name}.html" for name in names]
    for i, page in enumerate(pages):
        text = (index.parent / page).read_text()
        links = dict(re.findall(r'<a rel="(prev|next|index)" href="([^"]+)"', text))
        expected = {"index": "index.html"}
        if i > 0:
            expected["prev"] = pages[i - 1]
        if i + 1 < len(pages):
            expected["next"] = pages[i + 1]
        assert links == expected, page
        assert all((index.parent / target).exists() for target in links.values())
        assert text.count('<nav class="lesson-nav"') == 2  # at the top and at the bottom
    shown = _plain(index.read_text())
    assert "Lesson 01 (11 min)" in shown and "the second idea, wrapped onto a second line." in shown


@pytest.mark.parametrize("header, missing", [
    ("# 01 · Bare\n\nSome words. **Time**: about 10 minutes.", "learning objectives"),
    ("# 01 · Prose\n\n**You will learn** many things.\n\n**Time**: about 10 minutes.",
     "learning objectives"),
    ("# 01 · Timeless\n\n**You will learn**\n- a\n- b\n", "a time"),
])
def test_the_build_stops_naming_a_lesson_without_objectives_or_time(tmp_path, header, missing):
    source = _lesson_folder(tmp_path / "lessons", {
        "00_fine": HEADER.format(title="00 · Fine", minutes=5), "01_bad": header})
    with pytest.raises(ValueError, match=f"lesson 01_bad.ipynb: .* lacks {missing}"):
        build_site(tmp_path / "site", source=source)
    assert not (tmp_path / "site").exists()  # it stops before writing a page
