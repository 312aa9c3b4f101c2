"""A RingAnimation in real JupyterLab in headless Chromium: run the notebook, step, slide, play; screenshots.

The recipe is the one in FACTS.md: settings overrides (no news, no update check, no autosave), `?reset`,
wait on the notebook's sessionContext for an idle connected kernel, run all, then drive `.widget-*`
controls and poll screenshot hashes of the image until they change and settle.
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

pytestmark = [pytest.mark.slow, pytest.mark.timeout(150)]

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
anim.speed.value = 4
anim'''

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


def start_lab(root: Path, port: int, token: str) -> subprocess.Popen:
    """JupyterLab on 127.0.0.1 over `root`, with scratch settings and workspaces; its own process group."""
    settings = root.parent / "settings"
    settings.mkdir()
    (settings / "overrides.json").write_text(json.dumps(OVERRIDES))
    env = dict(os.environ, JUPYTER_RUNTIME_DIR=str(root.parent / "runtime"))
    return subprocess.Popen(
        [sys.executable, "-m", "jupyter", "lab", "--no-browser", "--allow-root", "--ip=127.0.0.1", f"--port={port}",
         f"--ServerApp.token={token}", f"--ServerApp.root_dir={root}", f"--LabApp.app_settings_dir={settings}",
         f"--LabApp.user_settings_dir={root.parent / 'user-settings'}",
         f"--LabApp.workspaces_dir={root.parent / 'workspaces'}", "--LabApp.expose_app_in_browser=True"],
        stdout=open(root.parent / "lab.log", "wb"), stderr=subprocess.STDOUT, env=env, start_new_session=True)


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


def test_ring_animation_steps_and_plays_in_jupyterlab(tmp_path):
    sync_api = pytest.importorskip("playwright.sync_api", reason="pip install playwright (never `playwright install`)")
    executable = chromium_or_skip()
    root = tmp_path / "lessons"
    root.mkdir()
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(NOTEBOOK)],
                                            metadata={"kernelspec": {"name": "python3", "display_name": "Python 3",
                                                                     "language": "python"}}), root / "ring.ipynb")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    for old in ARTIFACTS.glob("*.png"):
        old.unlink()
    port, token = free_port(), secrets.token_hex(16)
    lab = start_lab(root, port, token)
    try:
        wait_for_lab(lab, port, token, tmp_path / "lab.log")
        with sync_api.sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS, timeout=30_000)
            try:
                page = browser.new_page(viewport={"width": 1280, "height": 1000})
                page.set_default_timeout(30_000)
                page.goto(f"http://127.0.0.1:{port}/lab/tree/ring.ipynb?reset&token={token}")
                page.wait_for_function(KERNEL_READY, timeout=60_000, polling=250)
                page.evaluate("window.jupyterapp.commands.execute('notebook:run-all-cells')")
                page.wait_for_function(ALL_CELLS_RAN, timeout=60_000, polling=250)
                image = page.locator(".widget-image").first
                image.wait_for(state="visible")
                readout = page.locator(".widget-readout").first

                start, start_hash = settled_shot(image)
                assert readout.inner_text().strip() == "0"
                (ARTIFACTS / "1-step-0.png").write_bytes(start)
                page.screenshot(path=str(ARTIFACTS / "0-notebook.png"))

                page.locator(".allreduce-step-forward").first.click()  # the widget's "step ▶" button
                stepped, stepped_hash = settled_shot(image, differs_from=start_hash)
                assert readout.inner_text().strip() == "1"
                (ARTIFACTS / "2-step-1.png").write_bytes(stepped)

                handle = page.locator(".widget-hslider .noUi-handle").first
                handle.focus()
                handle.press("ArrowRight")
                slid, slid_hash = settled_shot(image, differs_from=stepped_hash)
                assert readout.inner_text().strip() == "2"
                (ARTIFACTS / "3-step-2.png").write_bytes(slid)

                page.locator(".widget-play button").first.click()  # Play: the timer drives the slider
                page.wait_for_function("() => Number(document.querySelector('.widget-readout').textContent) >= 4",
                                       timeout=20_000, polling=100)
                played, _ = settled_shot(image, differs_from=slid_hash, timeout=30_000)
                (ARTIFACTS / "4-played.png").write_bytes(played)
                assert int(readout.inner_text()) >= 4
                errors = page.locator(".widget-output .jp-OutputArea-output").all_inner_texts()
                assert not any("Traceback" in text for text in errors), errors
            finally:
                browser.close()
    finally:
        stop(lab)
    assert len({hashlib.sha256(p.read_bytes()).hexdigest() for p in ARTIFACTS.glob("[1-4]-*.png")}) == 4
