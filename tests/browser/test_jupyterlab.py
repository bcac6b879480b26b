"""The lessons as students meet them: JupyterLab in a real (headless) Chromium.

The suite starts JupyterLab on localhost with a random token, a free port and a temp copy
of ``notebooks/`` (private settings, workspaces and runtime dirs, so nothing from this
machine's Jupyter state leaks in). For every ``notebooks/NN_*.ipynb`` it executes the lesson
once, headless (``tests/notebooks``' ``execute_lesson``: no error, no stderr box, no Ray log
line or leftover, and the lesson's **claims** checked in its own kernel), opens the executed,
trusted notebook in JupyterLab and looks at every output as a student would:

* no traceback shows anywhere, no red stderr box unless the lesson explains it
  (``EXPLAINED_STDERR``: none today; lessons say an expected warning once, in their own words);
* no empty output where a figure belongs: every code cell that ends by drawing (a ``plot``,
  a figure, an animation, a widget) shows an image, an animation or a widget view;
* every figure drawn as an ``img`` has loaded (no broken-image icon), every widget renders
  (no "Error displaying widget"), every jshtml animation (the ring) has its controls;
* every predict-then-reveal prompt and conceptual diagram shows;
* the live widgets work on real ranks, on a fresh kernel (the lesson's first cell and the
  widget's cell): lesson 01's Train Step is clicked twice, lesson 03's pipeline explorer runs
  and then follows a slider, lesson 05's memory explorer follows its stage slider; each time
  the widget's figure must change (its PNG compared before and after) and no error may appear
  (``LIVE_WIDGETS``).

Executing headless and looking after (issue 39) costs a lesson's run once, not the browser's
live redrawing of every progress bar and figure while it runs; and each lesson is its own
unit of work, so the two workers share them. ``tests/notebooks`` executes a lesson itself only
where this suite does not run (no browser, or ``-m "not browser"``).

Screenshots go to ``artifacts/screenshots/`` (ignored by git): the whole page after Run All,
and every figure, animation and widget of every lesson, one file each
(``{lesson}-cell{NN}-{kind}{k}.png``), so a person can look at all of them.
``LABKIT_BROWSER_LESSONS=01,03`` limits the suite to some lessons (by number or stem).

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

from tests.notebooks.teaching import NOT_A_LESSON

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
SHOTS = ROOT / "artifacts" / "screenshots"
CHROMIUM = os.environ.get("LABKIT_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
CONCEPT_DIAGRAMS = tuple(sorted(
    name for module in ("data_parallel", "grid3d", "parameter_server", "pipeline", "ring",
                        "ring_attention", "tensor_parallel", "zero")
    for name, fn in vars(importlib.import_module(f"labkit.visuals.concepts.{module}")).items()
    if callable(fn) and not name.startswith("_") and name.startswith(("plot_", "zero_"))
    and getattr(fn, "__module__", "") == f"labkit.visuals.concepts.{module}"))
"""The diagram functions of ``labkit.visuals.concepts`` a lesson calls before it measures."""
DIAGRAM_LESSONS = {"01", "03", "04", "05", "09", "11", "14"}
"""Lessons whose mechanism has a conceptual diagram (issue 33: the ring and DP replicas, the
pipeline's stages, the TP split, ZeRO's partitions, the 3D grid, the parameter server; issue
34: ring attention's zig-zag layout and schedule)."""
DRAWS = ("plot", "_figure(", "animation_html(", "_viewer(", "_widget(", "_explorer(")
"""A code cell whose last statement calls one of these shows a figure, an animation or a
widget: its output must not be empty."""
EXPLAINED_STDERR: dict[str, tuple[str, ...]] = {}
"""Lesson stem -> stderr texts its markdown explains (none: lessons say warnings in words)."""
NOTEBOOK_TIMEOUT_S = 600  # Run All of the longest lesson (12, Ray) on a loaded 2-core machine
LIVE_TIMEOUT_S = 120  # a widget's run: the first one starts the kernel's pool

_missing = [why for cond, why in (
    (not Path(CHROMIUM).exists(), f"no chromium at {CHROMIUM} (apt-get install -y chromium)"),
    (importlib.util.find_spec("playwright") is None,
     "playwright is not installed (pip install playwright; no browser download needed)"),
    (importlib.util.find_spec("jupyterlab") is None, "jupyterlab is not installed"),
) if cond]
pytestmark = [pytest.mark.browser,
              pytest.mark.skipif(bool(_missing), reason="; ".join(_missing) or "ok")]


def _chosen(stem: str) -> bool:
    """Whether ``LABKIT_BROWSER_LESSONS`` (a comma list of numbers or stems) picks the lesson."""
    wanted = [w.strip() for w in os.environ.get("LABKIT_BROWSER_LESSONS", "").split(",")
              if w.strip()]
    return not wanted or any(stem == w or stem.startswith(w + "_") for w in wanted)


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

    def api(self, path: str, method: str = "GET") -> Any:
        req = urllib.request.Request(f"{self.base}{path}", method=method,
                                     headers={"Authorization": f"token {self.token}"})
        with urllib.request.urlopen(req, timeout=10) as resp:
            body = resp.read()
        return json.loads(body) if body else None


MARK = secrets.token_hex(16)
"""Every kernel of the suite's JupyterLab carries this in ``LABKIT_NOTEBOOK_MARK``, and so do
the Ray processes a lesson starts: the leftover check finds them, and only them."""


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    work = tmp_path_factory.mktemp("jupyterlab")
    root = work / "notebooks"
    shutil.copytree(ROOT / "notebooks", root,
                    ignore=shutil.ignore_patterns(".ipynb_checkpoints", "traces"))
    _write_settings(work / "settings")
    port, token = _free_port(), secrets.token_hex(16)
    env = dict(os.environ, PYTHONPATH=str(ROOT), LABKIT_NOTEBOOK_MARK=MARK,
               JUPYTERLAB_SETTINGS_DIR=str(work / "settings"),
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


def _wait_widgets_settled(page: Any, deadline: float) -> None:
    """Until no saved widget view is loading or shows a passing error.

    JupyterLab's widget manager (jupyterlab_widgets 3.0) restores a reopened notebook twice:
    once from the kernel and the notebook's saved state, and once more, kernel only, when the
    kernel's connection comes up. When the second finishes first, each saved view reads
    "Error displaying widget: model not found" until the first one ends and draws it again,
    a second or two later on a loaded machine (one CI run caught lesson 08's quiz there).
    An error still shown at the deadline is a real one, and the look that follows reports it."""
    busy = ("Loading widget...", "Error displaying widget")
    while any(page.get_by_text(text).count() for text in busy):
        if time.monotonic() > deadline:
            assert not page.get_by_text(busy[0]).count(), "a saved widget view never loaded"
            return
        page.wait_for_timeout(250)


def _run_all(page: Any) -> None:
    page.locator(".lm-MenuBar-item", has_text="Run").first.click()
    page.locator('.lm-Menu-item[data-command="runmenu:run-all"]').click()
    deadline = time.monotonic() + NOTEBOOK_TIMEOUT_S
    while _executed(page) < len(_prompts(page)):
        assert time.monotonic() < deadline, f"cells not run: {_prompts(page)}"
        page.wait_for_timeout(1000)
    _wait_idle(page, 60)


def _saved_cells(lab: Lab, page: Any, name: str) -> list[dict[str, Any]]:
    """Save through the UI (Ctrl+S), then read every code cell back from the server (in the
    order the page shows them)."""
    before = lab.api(f"/api/contents/{name}?content=0")["last_modified"]
    page.locator(".jp-Notebook").first.click()
    page.keyboard.press("Escape")
    page.keyboard.press("Control+s")
    deadline = time.monotonic() + 30
    while lab.api(f"/api/contents/{name}?content=0")["last_modified"] == before:
        assert time.monotonic() < deadline, f"{name} was not saved after Ctrl+S"
        page.wait_for_timeout(300)
    nb = lab.api(f"/api/contents/{name}?content=1")["content"]
    return [c for c in nb["cells"] if c["cell_type"] == "code"]


def _shoot(locator: Any, path: Path) -> None:
    locator.scroll_into_view_if_needed()
    locator.screenshot(path=str(path))


# ---- driving the live widgets -----------------------------------------------------------
def _cell_with(page: Any, marker: str) -> Any:
    """The code cell whose source contains ``marker`` (already run by Run All), once its
    widget view has rendered."""
    cell = page.locator(".jp-Notebook .jp-CodeCell").filter(
        has=page.locator(".jp-InputArea", has_text=marker)).first
    cell.scroll_into_view_if_needed()
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
    # the widget draws before it writes "step 1:", but the browser renders the two
    # widget updates as they arrive: give the drawing a moment to follow the status
    try:
        view.locator("svg rect.bar").first.wait_for(state="attached", timeout=10_000)
    except Exception as error:
        raise AssertionError("the step's replay was not drawn within 10 s of 'step 1:'") from error
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


def _draws(source: str) -> bool:
    """Whether a code cell ends by drawing: its last statement calls a figure, an
    animation or a widget (``DRAWS``)."""
    lines = [ln for ln in source.strip().splitlines() if ln.strip() and not ln.startswith(" ")]
    last = lines[-1] if lines else ""
    conditional = " if " in last and " else " in last  # draws only where it can
    return not conditional and not last.startswith(("print(", "import ", "from ")) and any(
        d in last for d in DRAWS)


def _shows_something(output: Any) -> bool:
    """An output area that holds a figure, an animation, a widget view or an SVG."""
    return output.locator("img, .animation, .jupyter-widgets, svg").count() > 0


def _look_at_every_output(page: Any, cells: list[dict[str, Any]], stem: str) -> list[str]:
    """Every code cell's output as a student sees it; returns what is wrong, and saves a
    screenshot of each figure, animation and widget."""
    problems = []
    dom = page.locator(".jp-Notebook .jp-CodeCell")
    assert dom.count() == len(cells), f"{dom.count()} code cells shown, {len(cells)} saved"
    explained = EXPLAINED_STDERR.get(stem, ())
    for n, saved in enumerate(cells):
        cell = dom.nth(n)
        area = cell.locator(".jp-OutputArea-output")
        for err in cell.locator(".jp-RenderedText[data-mime-type="
                                "'application/vnd.jupyter.stderr']").all():
            text = err.inner_text()
            if not any(e in text for e in explained):
                problems.append(f"cell {n}: a red stderr box: {text[:300]!r}")
        if "Traceback" in cell.locator(".jp-Cell-outputArea").first.inner_text():
            problems.append(f"cell {n}: a traceback")
        if area.get_by_text("Error displaying widget").count():
            problems.append(f"cell {n}: a widget failed to display")
        if _draws(saved["source"]) and not any(_shows_something(area.nth(k))
                                               for k in range(area.count())):
            problems.append(f"cell {n}: draws ({saved['source'].strip().splitlines()[-1]!r}) "
                            f"but shows no figure, animation or widget")
        for k, img in enumerate(area.locator("img").all()):
            img.scroll_into_view_if_needed()
            if not img.evaluate("i => i.complete && i.naturalWidth > 0"):
                problems.append(f"cell {n}: image {k} is empty or broken")
                continue
            _shoot(img, SHOTS / f"{stem}-cell{n:02d}-figure{k}.png")
        for k, anim in enumerate(area.locator(".animation").all()):
            if anim.locator(".anim-buttons button").count() < 5:
                problems.append(f"cell {n}: the animation's play / step controls are missing")
            _shoot(anim, SHOTS / f"{stem}-cell{n:02d}-animation{k}.png")
        for k, view in enumerate(area.filter(has=page.locator(".jupyter-widgets")).all()):
            if view.is_visible() and view.bounding_box():
                _shoot(view, SHOTS / f"{stem}-cell{n:02d}-widget{k}.png")
    return problems


def _look_at_teaching(page: Any, cells: list[dict[str, Any]], stem: str) -> list[str]:
    """The teaching cells as a student meets them (issue 33): every predict-then-reveal
    prompt shows its ``VAR = None`` line, every conceptual diagram
    (``labkit.visuals.concepts``) shows as a drawn figure; a screenshot of each
    (``STEM-cellNN-prompt.png``, ``STEM-cellNN-diagram.png``). A lesson (not the quiz) shows
    at least two prompts, and a lesson of ``DIAGRAM_LESSONS`` at least one diagram."""
    problems, prompts, diagrams = [], 0, 0
    dom = page.locator(".jp-Notebook .jp-CodeCell")
    for n, saved in enumerate(cells):
        meta = saved.get("metadata", {}).get("labkit", {})
        cell = dom.nth(n)
        if "predict" in meta:
            prompts += 1
            if f"{meta['predict']} = None" not in cell.locator(".jp-InputArea").inner_text():
                problems.append(f"cell {n}: the prompt for {meta['predict']!r} is not shown")
            _shoot(cell, SHOTS / f"{stem}-cell{n:02d}-prompt.png")
        if any(f"{name}(" in saved["source"] for name in CONCEPT_DIAGRAMS):
            diagrams += 1
            images = cell.locator(".jp-OutputArea-output img")
            if not images.count() or not images.first.evaluate(
                    "i => i.complete && i.naturalWidth > 0"):
                problems.append(f"cell {n}: the diagram did not draw")
                continue
            _shoot(images.first, SHOTS / f"{stem}-cell{n:02d}-diagram.png")
    if stem not in NOT_A_LESSON and prompts < 2:
        problems.append(f"{prompts} prompt(s) shown; a lesson asks for at least 2 predictions")
    if stem[:2] in DIAGRAM_LESSONS and not diagrams:
        problems.append("no conceptual diagram shown before the lesson's measurements")
    return problems


def _no_ray_left(name: str) -> None:
    """No Ray process a kernel of this suite's JupyterLab started outlives the notebook."""
    from tests.notebooks.test_notebooks import assert_no_ray_left

    assert_no_ray_left(name, MARK)


@pytest.mark.parametrize("path", [pytest.param(p, id=p.stem,
                                               marks=getattr(pytest.mark, f"lesson{p.name[:2]}"))
                                  for p in NOTEBOOKS])
@pytest.mark.timeout(900)  # the lesson's run, the look and a live widget, on a loaded machine
def test_lesson_renders_in_jupyterlab(lab: Lab, browser: Any, path: Path, tmp_path: Path) -> None:
    """Execute the lesson once, headless, with its claims checked in its own kernel
    (``tests/notebooks``' ``execute_lesson``); open the executed notebook in JupyterLab and
    look at every output as a student would: no traceback or unexplained stderr box, no empty
    place where a figure belongs, no broken image, every prompt and diagram shown; a
    screenshot of each. Then run the live widget, if the lesson has one, on a fresh kernel
    and drive it."""
    import nbformat
    from nbformat.sign import NotebookNotary

    from tests.notebooks.test_notebooks import execute_lesson

    stem = path.stem
    if not _chosen(stem):
        pytest.skip("not in LABKIT_BROWSER_LESSONS")
    SHOTS.mkdir(parents=True, exist_ok=True)
    executed = execute_lesson(path, tmp_path)
    NotebookNotary().sign(executed)  # trusted, as a notebook the student just ran: its
    nbformat.write(executed, lab.root / path.name)  # animations' scripts and widgets run
    cells = [c for c in executed.cells if c.cell_type == "code"]
    claims = "".join(str(o.get("text", "")) for o in cells[-1].get("outputs", []))
    assert claims.startswith(f"{stem}: "), f"{path.name}: the claims cell printed {claims!r}"
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = context.new_page()
    try:
        page.goto(f"{lab.base}/lab/tree/{path.name}?reset&token={lab.token}")
        shown = page.locator(".jp-Notebook .jp-CodeCell")
        shown.first.wait_for(timeout=90_000)
        deadline = time.monotonic() + 60
        while shown.count() < len(cells):
            assert time.monotonic() < deadline, f"{shown.count()} of {len(cells)} cells shown"
            page.wait_for_timeout(250)
        _wait_kernel_ready(lab, path.name)  # saved widget views are restored once it is
        _wait_widgets_settled(page, deadline + 60)  # connected
        page.wait_for_timeout(1500)  # let widget views and images finish drawing
        page.screenshot(path=str(SHOTS / f"{stem}.png"))
        problems = _look_at_every_output(page, cells, stem) + _look_at_teaching(page, cells, stem)
        assert not problems, f"{path.name}:\n" + "\n".join(problems)
        assert any(_draws(c["source"]) for c in cells), f"{path.name} draws nothing"
    except Exception:
        page.screenshot(path=str(SHOTS / f"{stem}-FAILED.png"))
        raise
    finally:
        context.close()
    if stem in LIVE_WIDGETS:
        _drive_live_widget(lab, browser, path, executed)


def _drive_live_widget(lab: Lab, browser: Any, path: Path, executed: Any) -> None:
    """The lesson's live widget on real ranks, in JupyterLab: a notebook of the lesson's first
    cell (its imports and pool) and the widget's cell, Run All, then driven
    (``LIVE_WIDGETS``); its kernel is shut down after, and no Ray process is left."""
    import nbformat

    stem = path.stem
    marker, drive = LIVE_WIDGETS[stem]
    code = [c for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code"]
    widget = next(c for c in code if marker in c.source)
    live = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(code[0].source),
                                           nbformat.v4.new_code_cell(widget.source)],
                                    metadata=executed.metadata)
    live.metadata.pop("widgets", None)
    name = f"{stem}-live.ipynb"
    nbformat.write(live, lab.root / name)
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = context.new_page()
    try:
        page.goto(f"{lab.base}/lab/tree/{name}?reset&token={lab.token}")
        page.locator(".jp-NotebookPanel .jp-Cell").first.wait_for(timeout=90_000)
        _wait_kernel_ready(lab, name)
        page.locator('.jp-Notebook-ExecutionIndicator[data-status="idle"]').first.wait_for(
            timeout=90_000)
        _run_all(page)
        drive(page, _cell_with(page, marker), stem)
        errors = [o for c in _saved_cells(lab, page, name) for o in c.get("outputs", [])
                  if o.get("output_type") == "error"]
        assert not errors, f"{name}: {errors[0].get('ename')}: {errors[0].get('evalue')}"
    except Exception:
        page.screenshot(path=str(SHOTS / f"{stem}-live-FAILED.png"))
        raise
    finally:
        context.close()
        for session in lab.api("/api/sessions"):
            if session.get("path", "").endswith(name):
                lab.api(f"/api/sessions/{session['id']}", method="DELETE")
    _no_ray_left(name)
