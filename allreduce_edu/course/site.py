"""The course as a static site: every executed lesson as an HTML page that needs no kernel, no
server and no network. `allreduce-edu site [DIR]`.

nbconvert turns each committed notebook into a page. Two things make it a course page rather than a
printout:

- every animation and timeline plays: the executed notebook kept each widget's state (its ES
  module and its data), and the page runs that module from a plain script instead of the live
  widget, which would need a kernel (viz/browser.py);
- every exercise stays a scaffold with its "not attempted yet" feedback, and its hints follow it,
  folded (`<details>`), one per click, as `hint()` gives them in the notebook. Solutions stay out.

The index lists each lesson's title, objectives and time, read from its header, and each page
links to the previous and next lesson and back to the index (site_index.py).
"""

from __future__ import annotations

import copy
import html
import re
from pathlib import Path

import nbformat

from ..exercises import all_exercises
from ..viz.browser import standalone_html
from .files import exercise_cells, lesson_files
from .site_index import Lesson, index_item, nav, with_nav
from .site_index import lesson as lesson_header

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"
OFFLINE = {name: "" for name in ("require_js_url", "jquery_url", "mathjax_url", "mermaid_js_url",
                                 "mermaid_layout_elk_js_url", "widget_renderer_url",
                                 "jupyter_widgets_base_url")}  # nothing from a CDN

INDEX = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>allreduce-edu: the lessons</title>
<style>body {{ font-family: system-ui, sans-serif; max-width: 46em; margin: 3em auto;
line-height: 1.5; padding: 0 1em; }} li {{ margin: 0.3em 0; }}
li.lesson {{ margin: 1em 0; }} .time {{ color: #555; }} ul.objectives {{ font-size: 0.95em; }}
</style></head>
<body><h1>allreduce-edu</h1>
<p>Collective communication, lesson by lesson: every page was executed on real ranks; the
animations play here without a kernel. To run the lessons yourself:
<code>pip install allreduce-edu</code>, then <code>allreduce-edu lessons</code>.</p>
<ol start="0">
{items}
</ol></body></html>
"""


def static_notebook(nb: dict) -> dict:
    """A copy of `nb` for a page without a kernel: each anywidget output drawn by its saved module
    and state; no widget state left in the metadata (it would pull a widget manager from a CDN);
    each exercise followed by its hints, folded."""
    nb = copy.deepcopy(nb)
    saved = nb.get("metadata", {}).pop("widgets", {}).get(WIDGET_STATE, {}).get("state", {})
    for cell in nb["cells"]:
        for output in cell.get("outputs", []):
            data = output.get("data", {})
            model = saved.get(data.get(WIDGET_VIEW, {}).get("model_id"), {}).get("state", {})
            if "_esm" in model:  # an anywidget: its module and traits draw it in the page
                traits = {k: v for k, v in model.items() if not k.startswith("_")}
                data["text/html"] = standalone_html(model["_esm"], traits, model.get("_css", ""))
                del data[WIDGET_VIEW]
    known = all_exercises()
    by_cell = {id(cell): name for name, cell in exercise_cells(nb).items()}
    cells = []
    for cell in nb["cells"]:
        cells.append(cell)
        name = by_cell.get(id(cell))
        if name in known and known[name].hints:
            cells.append(nbformat.v4.new_markdown_cell(folded_hints(known[name])))
    nb["cells"] = cells
    return nbformat.from_dict(nb)


def folded_hints(exercise) -> str:
    """An exercise's hints as folded <details>, in order."""
    hints, name = exercise.hints, exercise.id
    return "\n".join(f"<details><summary>Hint {i} of {len(hints)} for exercise {name}</summary>"
                     f"\n\n{html.escape(hint)}\n\n</details>" for i, hint in enumerate(hints, 1))


def build_site(folder, lessons: list[str] | None = None, source=None) -> Path:
    """Write one page per lesson (or only `lessons`, e.g. ["03"]; from `source`, default the
    course's lessons) and an index into `folder`; return the index's path. Each page links to the
    previous and next page built. A ValueError names a lesson whose header lacks objectives or a
    time, before any page is written."""
    from nbconvert import HTMLExporter  # imported here: `allreduce-edu --help` stays quick

    every = lesson_files(source)
    paths = [p for p in every if not lessons or p.name[:2] in lessons]
    if not paths:
        raise ValueError(f"no lesson {', '.join(lessons or [])}; lessons: "
                         f"{', '.join(p.name[:2] for p in every)}")
    notebooks = [nbformat.read(path, as_version=4) for path in paths]
    order = [lesson_header(nb, path) for nb, path in zip(notebooks, paths, strict=True)]
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    exporter = HTMLExporter(template_name="lab", **OFFLINE)
    for i, (nb, lesson) in enumerate(zip(notebooks, order, strict=True)):
        resources = {"metadata": {"name": lesson.title}}
        body, _ = exporter.from_notebook_node(static_notebook(nb), resources=resources)
        body = re.sub(r'<script src="">\s*</script>', "", body)  # the CDN scripts left out
        body = with_nav(body, nav(order, i))
        (folder / lesson.page).write_text(body, encoding="utf-8")
    return write_index(folder, order)


def write_index(folder, lessons: list[Lesson]) -> Path:
    """The index of `lessons` (title, time, objectives) written into `folder`; its path."""
    index = Path(folder) / "index.html"
    items = "\n".join(index_item(lesson) for lesson in lessons)
    index.write_text(INDEX.format(items=items), encoding="utf-8")
    return index


def command(args) -> int:
    """`allreduce-edu site DIR`: build, then say which file to open."""
    index = build_site(args.dir, args.lesson or None)
    print(f"{len(list(index.parent.glob('[0-9][0-9]_*.html')))} lesson pages in {index.parent}; "
          f"open {index.resolve().as_uri()} (no server needed)")
    return 0
