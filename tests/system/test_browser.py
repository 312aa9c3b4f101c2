"""The browser-side widgets in real front ends, in headless Chromium: a RingAnimation steps and plays in
JupyterLab and in Notebook 7 with no comm message on the kernel's websocket while it plays; the timeline's
hover details in JupyterLab; the static site's lesson 03 plays from file://, with no server at all.

The recipe is the one in FACTS.md: settings overrides (no news, no update check, no autosave), `?reset`,
wait on the notebook's sessionContext for an idle connected kernel, run all, then drive the widget's own
controls and poll screenshot hashes of the picture until they change and settle.
Screenshots land in test-artifacts/browser/ (git-ignored). Needs /usr/bin/chromium and `pip install playwright`.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import nbformat
import pytest

from allreduce_edu.runtime import osfacts

pytestmark = [pytest.mark.slow, pytest.mark.processes, pytest.mark.timeout(150)]

CHROMIUM = "/usr/bin/chromium"
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts" / "browser"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-quic"]
OVERRIDES = {  # see FACTS.md: news and update checks reach out; autosave writes half-run notebooks back
    "@jupyterlab/apputils-extension:notification": {"fetchNews": "false", "checkForUpdates": False},
    "@jupyterlab/docmanager-extension:plugin": {"autosave": False},
}
NOTEBOOK = '''\
import numpy as np
import allreduce_edu as ae
from allreduce_edu.viz import RingAnimation

cluster = ae.Cluster(4, transport="local")
x = [np.arange(8.0) + 10 * rank for rank in range(4)]
cluster.run(lambda comm: ae.allreduce(comm, x[comm.rank], algorithm="ring"))
anim = RingAnimation.from_cluster(cluster, values=x)
anim.speed = 4
anim'''
TIMELINE = '''\
from allreduce_edu.viz import timeline

timeline(cluster.trace)'''

KERNEL_READY = """() => {
    const widget = window.jupyterapp && window.jupyterapp.shell.currentWidget;
    const context = widget && widget.sessionContext;
    const kernel = context && context.session && context.session.kernel;
    return !!(context && context.isReady && kernel && kernel.status === 'idle'
              && kernel.connectionStatus === 'connected');
}"""
ALL_CELLS_RAN = """() => {
    const cells = window.jupyterapp.shell.currentWidget.content.model.cells;
    for (let i = 0; i < cells.length; i++) {
        const cell = cells.get(i);
        if (cell.type === 'code' && !cell.executionCount) return false;
    }
    return true;
}"""


def chromium_or_skip() -> str:
    """/usr/bin/chromium, or skip saying how to get it: tests never install system packages (.ci/run does)."""
    if not os.path.exists(CHROMIUM):
        pytest.skip(f"{CHROMIUM} is missing: `apt-get install -y chromium` (as .ci/run does; never "
                    "`playwright install`)")
    return CHROMIUM


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_lab(root: Path, port: int, token: str, app: str = "lab") -> subprocess.Popen:
    """JupyterLab (app="lab") or Notebook 7 (app="notebook") on 127.0.0.1 over `root`, with scratch settings
    and workspaces; its own process group."""
    settings = root.parent / "settings"
    settings.mkdir()
    if app == "lab":  # (Notebook 7 has neither plugin: overriding them breaks its settings load)
        (settings / "overrides.json").write_text(json.dumps(OVERRIDES))
    env = dict(os.environ, JUPYTER_RUNTIME_DIR=str(root.parent / "runtime"))
    traits = "LabApp" if app == "lab" else "JupyterNotebookApp"
    return subprocess.Popen(
        [sys.executable, "-m", "jupyter", app, "--no-browser", "--allow-root", "--ip=127.0.0.1", f"--port={port}",
         f"--ServerApp.token={token}", f"--ServerApp.root_dir={root}", f"--{traits}.app_settings_dir={settings}",
         f"--{traits}.user_settings_dir={root.parent / 'user-settings'}",
         f"--{traits}.workspaces_dir={root.parent / 'workspaces'}", f"--{traits}.expose_app_in_browser=True"],
        stdout=open(root.parent / "lab.log", "wb"), stderr=subprocess.STDOUT, env=env, **osfacts.new_group())


def wait_for_lab(proc: subprocess.Popen, port: int, token: str, log: Path, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"jupyter lab exited ({proc.returncode}):\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/status?token={token}", timeout=2) as reply:
                if reply.status == 200:
                    return
        except OSError:
            time.sleep(0.3)
    raise AssertionError(f"jupyter lab did not answer within {timeout:.0f} s:\n{log.read_text()[-3000:]}")


def stop(proc: subprocess.Popen) -> None:
    """End jupyter lab and its kernels: the whole process group, politely, then by force."""
    if not hasattr(os, "killpg"):  # Windows: its portable stop (Ctrl-Break, then TerminateProcess)
        for hard, wait in ((False, 10), (True, 5)):
            osfacts.stop_group(proc, hard=hard)
            try:
                proc.wait(wait)
                return
            except subprocess.TimeoutExpired:
                continue
        return
    for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 5)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(wait)
            return
        except subprocess.TimeoutExpired:
            continue


def settled_shot(locator, differs_from: str | None = None, timeout: float = 20.0) -> tuple[bytes, str]:
    """Screenshot `locator` until two shots in a row agree (and differ from `differs_from`); (png, hash)."""
    deadline, previous = time.monotonic() + timeout, None
    while time.monotonic() < deadline:
        png = locator.screenshot(timeout=5000)
        digest = hashlib.sha256(png).hexdigest()
        if digest == previous and digest != differs_from:
            return png, digest
        previous = digest
        time.sleep(0.25)
    raise AssertionError(f"the picture did not {'change and ' if differs_from else ''}settle within {timeout:.0f} s")


class CommMessages:
    """Counts the comm messages on the kernel's websocket, both ways (the widget protocol's traffic)."""

    def __init__(self, page):
        self.count = 0
        self.frames = 0
        page.on("websocket", lambda ws: (ws.on("framesent", self._seen), ws.on("framereceived", self._seen)))

    def _seen(self, payload) -> None:
        data = payload if isinstance(payload, bytes) else str(payload).encode()
        self.frames += 1
        self.count += b'"comm_msg"' in data


def lesson_folder(tmp_path: Path, *cells: str) -> Path:
    root = tmp_path / "lessons"
    root.mkdir()
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells],
                                            metadata={"kernelspec": {"name": "python3", "display_name": "Python 3",
                                                                     "language": "python"}}), root / "ring.ipynb")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    return root


def play_and_check(page, comms: CommMessages, prefix: str) -> None:
    """Step, slide and play the first step animation on the page; the kernel hears nothing while it plays."""
    picture = page.locator(".are-steps .are-picture").first
    picture.wait_for(state="visible")
    root = page.locator(".are-steps").first
    start, start_hash = settled_shot(picture)
    assert root.get_attribute("data-step") == "0"
    (ARTIFACTS / f"{prefix}-1-step-0.png").write_bytes(start)

    page.locator(".are-forward").first.click()
    stepped, stepped_hash = settled_shot(picture, differs_from=start_hash)
    assert root.get_attribute("data-step") == "1"
    assert page.locator(".are-readout").first.inner_text() == "reduce-scatter step 0"
    (ARTIFACTS / f"{prefix}-2-step-1.png").write_bytes(stepped)

    before = comms.count
    page.locator(".are-play").first.click()
    assert "pause" in page.locator(".are-play").first.inner_text()
    page.wait_for_function("() => document.querySelector('.are-steps').dataset.step === '6'",
                           timeout=20_000, polling=50)
    played, played_hash = settled_shot(picture, differs_from=stepped_hash)
    (ARTIFACTS / f"{prefix}-3-played.png").write_bytes(played)
    assert comms.count == before, f"{comms.count - before} comm messages while playing"
    assert "play" in page.locator(".are-play").first.inner_text()  # released after the last step
    assert page.locator(".are-play").first.get_attribute("title")  # and it has a tooltip

    # the counter does see widget traffic: Python moving the widget sends one
    page.evaluate("window.jupyterapp.shell.currentWidget.sessionContext.session.kernel"
                  ".requestExecute({code: 'anim.step = 2'})")
    page.wait_for_function("() => document.querySelector('.are-steps').dataset.step === '2'", timeout=20_000)
    assert comms.count > before
    assert len({start_hash, stepped_hash, played_hash}) == 3


def open_notebook(page, url: str) -> None:
    page.goto(url)
    page.wait_for_function(KERNEL_READY, timeout=60_000, polling=250)
    page.evaluate("window.jupyterapp.commands.execute('notebook:run-all-cells')")
    page.wait_for_function(ALL_CELLS_RAN, timeout=60_000, polling=250)


def browser_page(playwright, executable: str):
    browser = playwright.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS, timeout=30_000)
    page = browser.new_page(viewport={"width": 1280, "height": 1000})
    page.set_default_timeout(30_000)
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(f"{e}\n{e.stack}"))
    return browser, page, errors


@pytest.mark.parametrize("app, path", [("lab", "lab/tree/ring.ipynb?reset&"), ("notebook", "notebooks/ring.ipynb?")])
def test_ring_animation_plays_in_the_browser_with_the_kernel_idle(app, path, tmp_path):
    sync_api = pytest.importorskip("playwright.sync_api", reason="pip install playwright (never `playwright install`)")
    executable = chromium_or_skip()
    root = lesson_folder(tmp_path, NOTEBOOK, TIMELINE)
    port, token = free_port(), secrets.token_hex(16)
    server = start_lab(root, port, token, app)
    try:
        wait_for_lab(server, port, token, tmp_path / "lab.log")
        with sync_api.sync_playwright() as playwright:
            browser, page, errors = browser_page(playwright, executable)
            try:
                comms = CommMessages(page)
                open_notebook(page, f"http://127.0.0.1:{port}/{path}token={token}")
                page.screenshot(path=str(ARTIFACTS / f"{app}-0-notebook.png"))
                play_and_check(page, comms, app)
                if app == "lab":  # the timeline's hover details
                    bar = page.locator(".are-timeline .are-send").nth(3)
                    bar.scroll_into_view_if_needed()
                    bar.hover()
                    tip = page.locator(".are-timeline .are-tip").first
                    tip.wait_for(state="visible")
                    text = tip.inner_text()
                    assert "send rank" in text and "step" in text and "chunk" in text
                    assert " B" in text and " ms" in text
                    page.screenshot(path=str(ARTIFACTS / "lab-4-hover.png"))
                # Notebook 7's own bundle throws once while loading its settings (a schema it lacks): not ours
                ours = [e for e in errors if "/static/notebook/notebook_core." not in e]
                assert not ours, ours
            finally:
                browser.close()
    finally:
        stop(server)


def test_the_static_sites_lesson_plays_from_disk(tmp_path):
    sync_api = pytest.importorskip("playwright.sync_api", reason="pip install playwright (never `playwright install`)")
    executable = chromium_or_skip()
    from allreduce_edu.course.site import build_site

    index = build_site(tmp_path / "site", ["03"])
    page_path = next(index.parent.glob("03_*.html"))
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_api.sync_playwright() as playwright:
        browser, page, errors = browser_page(playwright, executable)
        try:
            requests: list[str] = []
            page.on("request", lambda r: requests.append(r.url))
            page.goto(page_path.as_uri())
            players = page.locator(".are-steps")
            assert players.count() >= 2  # the still and the player: every animation of the lesson draws itself
            player = players.nth(1)  # lesson 03's `anim`, at its start (the first is a still of step 0)
            picture = player.locator(".are-picture")
            picture.scroll_into_view_if_needed()
            start, start_hash = settled_shot(picture)
            (ARTIFACTS / "site-1-start.png").write_bytes(start)
            player.locator(".are-play").click()
            page.wait_for_function("(el) => el.dataset.step === '6'", arg=player.element_handle(), timeout=20_000)
            end, end_hash = settled_shot(picture, differs_from=start_hash)
            (ARTIFACTS / "site-2-end.png").write_bytes(end)
            player.locator(".are-back").click()
            _, back_hash = settled_shot(picture, differs_from=end_hash)
            assert len({start_hash, end_hash, back_hash}) == 3
            hints = page.locator("details")
            assert hints.count() >= 4 and not hints.first.evaluate("(d) => d.open")  # hints folded
            assert "not attempted yet" in page.content()
            assert all(url.startswith(("file:", "data:")) for url in requests), requests
            assert not errors, errors
        finally:
            browser.close()
