"""The lessons as students meet them: JupyterLab in a real (headless) Chromium.

The suite starts JupyterLab on localhost with a random token, a free port and a temp copy
of ``notebooks/`` (private settings, workspaces and runtime dirs, so nothing from this
machine's Jupyter state leaks in), then, for every ``notebooks/NN_*.ipynb``, opens it,
runs its cells through the UI, saves it, and checks what a student would see:

* no cell produced an error output (read from the saved notebook, exactly);
* the live widgets work on real ranks: lesson 01's Train Step is clicked twice, lesson 03's
  pipeline explorer runs and then follows a slider, lesson 05's memory explorer follows its
  stage slider; each time the widget's figure must change (its PNG compared before and
  after) and no error may appear (``LIVE_WIDGETS``);
* every matplotlib figure rendered as an ``img``; a cell showing one of labkit's widgets
  renders a live widget view, and no widget says "Error displaying widget" (progress bars
  are widgets that close themselves when the run ends); every jshtml animation (the ring)
  has its controls.

Screenshots (whole page plus the first figure, widget and animation) go to
``artifacts/screenshots/`` (ignored by git). To keep the browser suite to a few minutes on
2 cores, the lessons are driven as deeply as what only a browser can check needs:
``00_welcome`` and ``08_quick_test`` (the lightest, and the first pages everyone meets) run
ALL cells via Run > Run All Cells; the other lessons with a widget or an animation (01, 03,
05) run cell by cell until their first figure or animation has rendered, then drive their
live widget; the lessons that only draw figures (02, 04, 06, 07, 09-12) are opened, their
kernel started and their markdown rendered, but not run: every one of them is executed
top to bottom headless by ``tests/notebooks``, which checks its outputs, and inline
figures render in JupyterLab the same way for every lesson. ``LABKIT_BROWSER_FULL=all``
(or a comma list of stems) runs lessons fully; ``LABKIT_BROWSER_LIVE=all`` runs the
figure-only lessons until their first figure.

Needs Debian's ``chromium`` at /usr/bin/chromium (or ``LABKIT_CHROMIUM``) and Playwright
from PyPI; never lets Playwright download a browser. Skips with the reason otherwise.
"""

from __future__ import annotations

import importlib.util
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
SHOTS = ROOT / "artifacts" / "screenshots"
CHROMIUM = os.environ.get("LABKIT_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
ALWAYS_FULL = {"00_welcome", "08_quick_test"}
WIDGET_CALLS = ("labkit.widgets", "timeline_viewer(", "quiz_widget(", "_viewer(", "_widget(")
NOTEBOOK_TIMEOUT_S = 240
CELL_TIMEOUT_S = 180
LIVE_TIMEOUT_S = 120  # a widget's run: the first one starts the kernel's pool

_missing = [why for cond, why in (
    (not Path(CHROMIUM).exists(), f"no chromium at {CHROMIUM} (apt-get install -y chromium)"),
    (importlib.util.find_spec("playwright") is None,
     "playwright is not installed (pip install playwright; no browser download needed)"),
    (importlib.util.find_spec("jupyterlab") is None, "jupyterlab is not installed"),
) if cond]
pytestmark = [pytest.mark.browser,
              pytest.mark.skipif(bool(_missing), reason="; ".join(_missing) or "ok")]


def _full_run(stem: str) -> bool:
    chosen = os.environ.get("LABKIT_BROWSER_FULL", "")
    return stem in ALWAYS_FULL or chosen == "all" or stem in chosen.split(",")


def _runs_in_browser(stem: str, source: str) -> bool:
    """Whether the test runs this lesson's cells (see the module docstring)."""
    shows_live = "animat" in source or any(w in source for w in WIDGET_CALLS)
    return (_full_run(stem) or stem in LIVE_WIDGETS or shows_live
            or os.environ.get("LABKIT_BROWSER_LIVE", "") == "all")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _write_settings(settings: Path) -> None:
    """Render every cell (no windowing) and silence the news / update toasts."""
    files = {"@jupyterlab/notebook-extension/tracker.jupyterlab-settings":
             {"windowingMode": "none"},
             "@jupyterlab/apputils-extension/notification.jupyterlab-settings":
             {"fetchNews": "false", "checkForUpdates": False}}
    for name, value in files.items():
        path = settings / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(value))


class Lab:
    """A JupyterLab server on localhost: its URL, token and notebook folder."""

    def __init__(self, base: str, token: str, root: Path):
        self.base, self.token, self.root = base, token, root

    def api(self, path: str) -> Any:
        req = urllib.request.Request(f"{self.base}{path}",
                                     headers={"Authorization": f"token {self.token}"})
        with urllib.request.urlopen(req, timeout=10) as resp:
            return json.loads(resp.read())


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    work = tmp_path_factory.mktemp("jupyterlab")
    root = work / "notebooks"
    shutil.copytree(ROOT / "notebooks", root,
                    ignore=shutil.ignore_patterns(".ipynb_checkpoints", "traces"))
    _write_settings(work / "settings")
    port, token = _free_port(), secrets.token_hex(16)
    env = dict(os.environ, PYTHONPATH=str(ROOT), JUPYTERLAB_SETTINGS_DIR=str(work / "settings"),
               JUPYTERLAB_WORKSPACES_DIR=str(work / "workspaces"),
               JUPYTER_RUNTIME_DIR=str(work / "runtime"), JUPYTER_CONFIG_DIR=str(work / "config"))
    cmd = [sys.executable, "-m", "jupyterlab", "--no-browser", "--ServerApp.ip=127.0.0.1",
           f"--ServerApp.port={port}", "--ServerApp.port_retries=0",
           f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root}"]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        cmd.append("--allow-root")
    log = open(work / "jupyterlab.log", "wb")  # noqa: SIM115
    proc = subprocess.Popen(cmd, cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    server = Lab(f"http://127.0.0.1:{port}", token, root)
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                server.api("/api/status")
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("JupyterLab did not start:\n" + (
                        work / "jupyterlab.log").read_text(errors="replace")[-3000:]) from None
                time.sleep(0.5)
        yield server
    finally:
        os.killpg(proc.pid, signal.SIGTERM)  # the server and the kernels it started
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
        log.close()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            b.close()


# ---- driving the notebook UI -------------------------------------------------------------
def _prompts(page: Any) -> list[str]:
    return page.locator(".jp-CodeCell .jp-InputPrompt").all_inner_texts()


def _executed(page: Any) -> int:
    """Code cells that have finished running (their prompt shows a number)."""
    return sum(any(ch.isdigit() for ch in p) for p in _prompts(page))


def _wait_idle(page: Any, timeout_s: float) -> None:
    """Until no cell is queued or running ([*]) and the kernel reports idle."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        busy = any("*" in p for p in _prompts(page))
        status = page.locator(".jp-Notebook-ExecutionIndicator").first
        idle = status.count() == 0 or status.get_attribute("data-status") in (None, "idle")
        if not busy and idle:
            return
        page.wait_for_timeout(500)
    raise AssertionError(f"cells still running after {timeout_s:.0f} s: {_prompts(page)}")


def _wait_kernel_ready(lab: Lab, name: str, timeout_s: float = 90) -> None:
    """Until the server says this notebook's kernel is started and idle."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for session in lab.api("/api/sessions"):
            if session.get("path", "").endswith(name) and \
                    session["kernel"].get("execution_state") == "idle":
                return
        time.sleep(0.5)
    raise AssertionError(f"the kernel of {name} did not start within {timeout_s:.0f} s")


def _run_all(page: Any) -> None:
    page.locator(".lm-MenuBar-item", has_text="Run").first.click()
    page.locator('.lm-Menu-item[data-command="runmenu:run-all"]').click()
    deadline = time.monotonic() + NOTEBOOK_TIMEOUT_S
    while _executed(page) < len(_prompts(page)):
        assert time.monotonic() < deadline, f"cells not run: {_prompts(page)}"
        page.wait_for_timeout(500)
    _wait_idle(page, 30)


def _run_until_rendered(page: Any, selector: str) -> int:
    """Shift+Enter cell by cell until ``selector`` shows up in an output; cells run."""
    cells = page.locator(".jp-Notebook .jp-Cell")
    cells.first.locator(".jp-InputPrompt, .jp-Cell-inputCollapser").first.click()
    page.keyboard.press("Escape")
    for n in range(cells.count()):
        is_code = page.locator(".jp-Notebook .jp-Cell.jp-mod-active.jp-CodeCell").count() > 0
        done = _executed(page)
        page.keyboard.press("Shift+Enter")
        deadline = time.monotonic() + CELL_TIMEOUT_S
        while is_code and _executed(page) <= done:  # until this cell got its number
            assert time.monotonic() < deadline, f"cell {n} did not finish: {_prompts(page)}"
            page.wait_for_timeout(300)
        _wait_idle(page, CELL_TIMEOUT_S)
        if page.locator(f".jp-OutputArea-output {selector}").count():
            return n + 1
    raise AssertionError(f"ran every cell and {selector!r} never rendered")


def _saved_cells(lab: Lab, page: Any, name: str) -> list[dict[str, Any]]:
    """Save through the UI (Ctrl+S), then read the executed code cells back from the server."""
    before = lab.api(f"/api/contents/{name}?content=0")["last_modified"]
    page.locator(".jp-Notebook").first.click()
    page.keyboard.press("Escape")
    page.keyboard.press("Control+s")
    deadline = time.monotonic() + 30
    while lab.api(f"/api/contents/{name}?content=0")["last_modified"] == before:
        assert time.monotonic() < deadline, f"{name} was not saved after Ctrl+S"
        page.wait_for_timeout(300)
    nb = lab.api(f"/api/contents/{name}?content=1")["content"]
    return [c for c in nb["cells"] if c["cell_type"] == "code" and c.get("execution_count")]


def _shoot(locator: Any, path: Path) -> None:
    locator.scroll_into_view_if_needed()
    locator.screenshot(path=str(path))


# ---- driving the live widgets -----------------------------------------------------------
def _run_cell_with(page: Any, marker: str) -> Any:
    """Run the one code cell whose source contains ``marker``; returns that cell."""
    cell = page.locator(".jp-Notebook .jp-CodeCell").filter(
        has=page.locator(".jp-InputArea", has_text=marker)).first
    cell.scroll_into_view_if_needed()
    cell.locator(".jp-InputPrompt").first.click()
    page.keyboard.press("Escape")
    done = _executed(page)
    page.keyboard.press("Control+Enter")
    deadline = time.monotonic() + CELL_TIMEOUT_S
    while _executed(page) <= done and "[*]" not in "".join(_prompts(page)):
        assert time.monotonic() < deadline, f"the cell with {marker!r} did not start"
        page.wait_for_timeout(200)
    _wait_idle(page, CELL_TIMEOUT_S)
    cell.locator(".jupyter-widgets").first.wait_for(timeout=30_000)
    return cell


def _wait_text(view: Any, text: str, what: str) -> None:
    """Until ``text`` shows in the widget view; fail at once on a shown failure."""
    deadline = time.monotonic() + LIVE_TIMEOUT_S
    while text not in view.inner_text():
        shown = view.inner_text()
        assert "failed" not in shown and "Error" not in shown, f"{what}: {shown[-800:]}"
        assert time.monotonic() < deadline, f"{what}: no {text!r} after {LIVE_TIMEOUT_S} s"
        view.page.wait_for_timeout(250)


def _figure(view: Any) -> bytes:
    """The widget's (last) figure as the browser draws it: a screenshot of that image."""
    imgs = view.locator("img")
    imgs.first.wait_for(timeout=30_000)  # drawn just after the status line
    img = imgs.nth(imgs.count() - 1)
    img.scroll_into_view_if_needed()
    return bytes(img.screenshot())


def _wait_new_figure(view: Any, old: bytes, what: str) -> None:
    """Until the widget's figure looks different from ``old`` (it is redrawn just after
    the status line changes)."""
    deadline = time.monotonic() + 30
    while _figure(view) == old:
        assert time.monotonic() < deadline, f"the figure did not change: {what}"
        view.page.wait_for_timeout(300)


def _set_slider(view: Any, label: str, value: int) -> None:
    """Type a value into an ipywidgets slider's readout (as a student can) and commit it."""
    slider = view.locator(".widget-slider").filter(has=view.page.locator(
        ".widget-label", has_text=label)).first
    readout = slider.locator(".widget-readout")
    readout.click()
    view.page.keyboard.press("Control+a")
    view.page.keyboard.type(str(value))
    view.page.keyboard.press("Enter")


def _drive_train_step(page: Any, cell: Any, stem: str) -> None:
    """Two clicks, two real steps: the replay and the figure show step 1, then step 2."""
    view = cell.locator(".jp-OutputArea-output").first
    button = view.locator("button", has_text="Train Step")
    button.click()
    _wait_text(view, "step 1:", "Train Step (first click)")
    assert view.locator("svg rect.bar").count() > 0, "the step's replay was not drawn"
    first = _figure(view)
    page.wait_for_timeout(2500)  # mid-replay: buckets on their way to the wire
    _shoot(view, SHOTS / f"{stem}-train-step.png")
    button.click()
    _wait_text(view, "step 2:", "Train Step (second click)")
    _wait_new_figure(view, first, "after a second Train Step")


def _follow_slider(view: Any, label: str, value: int, shown: str, shot: Path) -> None:
    """Move a slider: the widget must rerun on the pool and redraw its (last) figure."""
    first = _figure(view)
    _set_slider(view, label, value)
    _wait_text(view, shown, f"{label} = {value}")
    _wait_new_figure(view, first, f"the measured figure after {label} = {value}")
    _shoot(view, shot)


def _drive_pipeline(page: Any, cell: Any, stem: str) -> None:
    """Run it for real, then move m: the measured figure follows the slider."""
    view = cell.locator(".jp-OutputArea-output").first
    view.locator("button", has_text="Run it for real").click()
    _wait_text(view, "measured", "pipeline explorer (Run it for real)")
    _follow_slider(view, "microbatches", 8, "m=8", SHOTS / f"{stem}-pipeline-live.png")


def _drive_memory(page: Any, cell: Any, stem: str) -> None:
    """Move the ZeRO stage: the measured bars (the last figure) are rerun and redrawn."""
    view = cell.locator(".jp-OutputArea-output").first
    _wait_text(view, "rank 0 keeps", "memory explorer (first measurement)")
    _follow_slider(view, "ZeRO stage", 3, "stage 3,", SHOTS / f"{stem}-memory-live.png")


LIVE_WIDGETS = {"01_data_parallelism": ("train_step_widget(", _drive_train_step),
                "03_pipeline_parallelism": ("pipeline_explorer(", _drive_pipeline),
                "05_memory_and_zero": ("memory_explorer(", _drive_memory)}
"""Lessons whose live widget the test runs and drives after their first figure."""


def _check_opened(page: Any, path: Path) -> None:
    """A figure-only lesson as it opens: its cells laid out, its markdown rendered (title
    first), its kernel idle; a screenshot of the page."""
    nb = json.loads(path.read_text())
    title = "".join(nb["cells"][0]["source"]).splitlines()[0].lstrip("# ").strip()
    heading = page.locator(".jp-RenderedMarkdown h1").first
    heading.wait_for(timeout=30_000)
    assert title.split()[0] in heading.inner_text(), f"{path.name}: title {title!r} not shown"
    assert page.locator(".jp-Notebook .jp-CodeCell").count() >= 1, "no code cell rendered"
    assert page.locator(".jp-OutputArea-output .jp-RenderedText[data-mime-type="
                        "'application/vnd.jupyter.stderr']").count() == 0
    page.screenshot(path=str(SHOTS / f"{path.stem}.png"))


@pytest.mark.parametrize("path", [pytest.param(p, id=p.stem,
                                               marks=getattr(pytest.mark, f"lesson{p.name[:2]}"))
                                  for p in NOTEBOOKS])
def test_lesson_renders_in_jupyterlab(lab: Lab, browser: Any, path: Path) -> None:
    """Open the lesson in JupyterLab, run it, and check errors, figures, widgets, animations."""
    SHOTS.mkdir(parents=True, exist_ok=True)
    stem, source = path.stem, path.read_text()
    animates = "animat" in source  # the ring lesson's jshtml animation
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = context.new_page()
    try:
        page.goto(f"{lab.base}/lab/tree/{path.name}?reset&token={lab.token}")
        page.locator(".jp-NotebookPanel .jp-Cell").first.wait_for(timeout=90_000)
        _wait_kernel_ready(lab, path.name)
        page.locator('.jp-Notebook-ExecutionIndicator[data-status="idle"]').first.wait_for(
            timeout=90_000)
        page.wait_for_timeout(1000)
        if not _runs_in_browser(stem, source):
            _check_opened(page, path)
            return
        if _full_run(stem):
            _run_all(page)
            mode = "all cells"
        else:
            ran = _run_until_rendered(page, ".anim-buttons" if animates else "img")
            mode = f"first {ran} cells (until the first {'animation' if animates else 'figure'})"
        if stem in LIVE_WIDGETS:
            marker, drive = LIVE_WIDGETS[stem]
            drive(page, _run_cell_with(page, marker), stem)
            mode += f", then its live widget ({marker[:-1]})"
        page.wait_for_timeout(1500)  # let widget views and images finish drawing
        page.screenshot(path=str(SHOTS / f"{stem}.png"))
        cells = _saved_cells(lab, page, path.name)
        outputs = [o for c in cells for o in c.get("outputs", [])]
        errors = [o for o in outputs if o.get("output_type") == "error"]
        assert not errors, (f"{path.name} ({mode}): {errors[0].get('ename')}: "
                            f"{errors[0].get('evalue')}")
        area = page.locator(".jp-OutputArea-output")
        assert area.get_by_text("Error displaying widget").count() == 0, "a widget failed"
        figures = [o for o in outputs if "image/png" in o.get("data", {})]
        if figures:
            imgs = area.locator("img")
            assert imgs.count() >= len(figures), f"{len(figures)} figures, {imgs.count()} shown"
            assert imgs.first.evaluate("i => i.complete && i.naturalWidth > 0"), "figure blank"
            _shoot(imgs.first, SHOTS / f"{stem}-figure.png")
        # progress bars are widgets too, closed when their run ends: require a live view
        # only where a cell that ran shows one of labkit's widgets
        widgets = [c["source"] for c in cells if any(w in c["source"] for w in WIDGET_CALLS)]
        if widgets:
            views = page.locator(".jp-OutputArea-output:has(.jupyter-widgets)")
            assert views.count() >= 1, f"no widget view rendered for {widgets[0]!r}"
            assert views.last.is_visible(), "the widget view is not visible"
            _shoot(views.last, SHOTS / f"{stem}-widget.png")
        if any("anim-buttons" in str(o.get("data", {}).get("text/html", "")) for o in outputs):
            controls = area.locator(".anim-buttons button")
            assert controls.count() >= 5, "the animation's play / step controls are missing"
            _shoot(area.locator(".animation").first, SHOTS / f"{stem}-animation.png")
        assert figures or widgets or not _full_run(stem), (
            f"{path.name} ran fully but rendered no figure or widget")
    except Exception:
        page.screenshot(path=str(SHOTS / f"{stem}-FAILED.png"))
        raise
    finally:
        context.close()
