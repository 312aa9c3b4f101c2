"""The site's index and its links between pages: each lesson's title, learning objectives and time,
read from the lesson's own header (its first markdown cell), so the index cannot drift from it."""

from __future__ import annotations

import html
import re
from dataclasses import dataclass
from pathlib import Path

from .files import source

# what opens the objectives list: "**You will learn**", "By the end of this lesson you can:", ...
OBJECTIVES = re.compile(r"^\W*(you will learn|you will|you'll learn|by the end\b|in this lesson you"
                        r"|(learning )?objectives|what you will learn)", re.IGNORECASE)
BULLET = re.compile(r"^\s{0,3}(?:[-*+]|\d+[.)])\s+(.*)$")
MINUTES = r"(\d+)(?:\s*[-–]\s*(\d+))?\s*(?:minutes?|mins?)\b"
DURATION = re.compile(r"(?:about|around|roughly|~|≈)\s*" + MINUTES, re.IGNORECASE)
LABELLED = re.compile(r"\btime\b(?:\*\*)?\s*:\s*(?:\*\*)?\s*(?:about|around|roughly|~|≈)?\s*"
                      + MINUTES, re.IGNORECASE)  # "**Time**: about 20 minutes", "Time: ~40 min"
RUNNING = re.compile(r"\b(run|runs|execute|executes)\b", re.IGNORECASE)


@dataclass(frozen=True)
class Lesson:
    """A lesson as the index shows it: its page, title, objectives (markdown) and time."""

    stem: str
    title: str
    objectives: tuple[str, ...]
    time: str  # "20 min", or "30–40 min"

    @property
    def page(self) -> str:
        return f"{self.stem}.html"


def lesson(nb: dict, path: Path) -> Lesson:
    """The lesson's title, objectives and time from its first markdown cell; a ValueError naming
    the lesson when the header has no objectives list or no time."""
    header = next((source(c) for c in nb["cells"] if c["cell_type"] == "markdown"), "")
    missing = []
    objectives = header_objectives(header)
    time = header_time(header)
    if not objectives:
        missing.append('learning objectives (a "**You will learn**" line, then a bullet list)')
    if not time:
        missing.append('a time (e.g. "**Time**: about 20 minutes")')
    if missing:
        raise ValueError(f"lesson {path.name}: its header (first markdown cell) lacks "
                         f"{' and '.join(missing)}")
    return Lesson(path.stem, header_title(header) or path.stem, objectives, time)


def header_title(header: str) -> str:
    """The header's first '# ' heading, else ''."""
    return next((line[2:].strip() for line in header.splitlines() if line.startswith("# ")), "")


def header_objectives(header: str) -> tuple[str, ...]:
    """The bullets after the line that opens the objectives, each joined onto one line."""
    lines = header.splitlines()
    for start in (i for i, line in enumerate(lines) if OBJECTIVES.match(line)):
        items: list[str] = []
        for line in lines[start + 1:]:
            bullet = BULLET.match(line)
            if bullet:
                items.append(bullet.group(1).strip())
            elif items and line.strip() and line[:1].isspace():  # a bullet's wrapped line
                items[-1] += " " + line.strip()
            elif items or line.strip():
                break  # the list ended, or no list follows this line
        if any(items):
            return tuple(item for item in items if item)
    return ()


def header_time(header: str) -> str:
    """The learner's time the header gives ("**Time**: about 15 minutes", "About 20 minutes; the
    cells run in about a minute", "~40 min"), as "15 min"; not the notebook's own run time."""
    text = " ".join(header.split())
    found = LABELLED.search(text)
    if not found:
        clauses = re.split(r"[.;()]", text)
        found = next((m for clause in clauses if not RUNNING.search(clause)
                      for m in [DURATION.search(clause)] if m), None)
    if not found:
        return ""
    low, high = found.groups()
    return f"{low}–{high} min" if high else f"{low} min"


def inline(markdown: str) -> str:
    """A line of markdown as HTML: `code`, **bold** and *emphasis*, everything else escaped."""
    parts = re.split(r"(`[^`]+`)", markdown)
    out = []
    for part in parts:
        if part.startswith("`") and part.endswith("`") and len(part) > 1:
            out.append(f"<code>{html.escape(part[1:-1])}</code>")
            continue
        text = html.escape(part, quote=False)
        text = re.sub(r"\*\*(.+?)\*\*", r"<strong>\1</strong>", text)
        text = re.sub(r"(?<![\w*])\*(?!\s)(.+?)(?<!\s)\*(?![\w*])", r"<em>\1</em>", text)
        out.append(text)
    return "".join(out)


def index_item(lesson_: Lesson) -> str:
    """One lesson's entry in the index: its link, its time and its objectives."""
    objectives = "\n".join(f"<li>{inline(o)}</li>" for o in lesson_.objectives)
    return (f'<li class="lesson"><a href="{lesson_.page}">{html.escape(lesson_.title)}</a> '
            f'<span class="time">({html.escape(lesson_.time)})</span>\n'
            f'<ul class="objectives">\n{objectives}\n</ul></li>')


def nav(lessons: list[Lesson], i: int) -> str:
    """The links at the top and bottom of lesson i's page: previous, index, next."""
    links = []
    if i > 0:
        links.append(f'<a rel="prev" href="{lessons[i - 1].page}">← '
                     f"{html.escape(lessons[i - 1].title)}</a>")
    links.append('<a rel="index" href="index.html">All lessons</a>')
    if i + 1 < len(lessons):
        links.append(f'<a rel="next" href="{lessons[i + 1].page}">'
                     f"{html.escape(lessons[i + 1].title)} →</a>")
    return ('<nav class="lesson-nav" style="display:flex; justify-content:space-between; gap:1em; '
            'font-family:system-ui, sans-serif; margin:1em 2em">' + " ".join(links) + "</nav>")


def with_nav(page: str, links: str) -> str:
    """The page with `links` just after <body …> and just before </body>."""
    page = re.sub(r"(<body[^>]*>)", lambda m: m.group(1) + "\n" + links, page, count=1)
    head, sep, tail = page.rpartition("</body>")
    return head + links + "\n" + sep + tail if sep else page + links
