"""Widgets that draw and play in the browser (anywidget), and the same picture without a kernel.

A `BrowserWidget` is an anywidget: its ES module (`steps.js`, `timeline.js`) gets its synced
traits and does all the drawing and playing in the page. A front end with a widget manager
(JupyterLab, Notebook 7, VS Code) runs it live, and an executed notebook keeps every widget's state
(module included) in its metadata, so a lesson opened before it runs still shows its animations.
Where no kernel and no widget manager run (an exported page, the static site of `allreduce-edu
site`), `standalone_html` runs the same module from a plain script, behind a stand-in for the
widget model, offline, from `file://`.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import anywidget

HERE = Path(__file__).parent
CSS = HERE / "steps.css"

_STANDALONE = """\
<style>{css}</style>
<div class="are-standalone" id="{id}"></div>
<script>
(function () {{
  const el = document.currentScript.previousElementSibling;  // this fragment's own div
  if (!el || el.dataset.rendered) return;
  el.dataset.rendered = "1";
  const traits = {traits};
  // the widget model's surface that the module uses: it reads traits, nothing is ever sent
  const model = {{ get: (name) => traits[name], set: (name, value) => {{ traits[name] = value; }},
                  on() {{}}, off() {{}}, save_changes() {{}} }};
  const widget = (function () {{
{module}
  }})();
  widget.render({{ model, el }});
}})();
</script>
"""


def standalone_html(module: str, traits: dict, css: str = "") -> str:
    """`module` (an ES module ending in `export default {{ render }}`) rendered with `traits` by a
    plain script: no kernel, no widget manager, no network. The same input gives the same text."""
    if "export default { render };" not in module:
        raise ValueError("the module must end with `export default { render };`")
    if "</script" in module.lower() or "</style" in css.lower():
        raise ValueError("the module or its style would end the page's <script> or <style>")
    body = module.replace("export default { render };", "return { render };")
    data = json.dumps(traits, sort_keys=True, separators=(",", ":"))
    digest = hashlib.sha256((body + data).encode()).hexdigest()[:12]
    # <, > and & as JSON escapes: no text in the data can close the script or open a comment
    safe = data.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
    return _STANDALONE.format(css=css, id=f"are-{digest}", traits=safe, module=body)


class BrowserWidget(anywidget.AnyWidget):
    """An anywidget that can also be written out as a page fragment that needs no kernel."""

    _css = CSS
    # the traits the standalone copy needs (the module reads these with model.get)
    _standalone_traits: tuple[str, ...] = ()

    def to_html(self) -> str:
        """A self-contained HTML fragment that draws (and plays) this widget with no kernel."""
        # _esm and _css hold the files' text (anywidget read the files the class names)
        return standalone_html(self._esm, {name: getattr(self, name)
                                           for name in self._standalone_traits}, self._css)
