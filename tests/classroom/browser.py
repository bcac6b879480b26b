"""A student at the hub in a real browser (Playwright with Debian's chromium, headless).

Each step is what a student does in JupyterLab: log in at the hub's login page, open the
Assignments panel (menu Nbgrader > Assignment List), fetch, submit, fetch feedback, run a
notebook cell. Notebook contents are written through the student's own Jupyter server
(its contents API, from the page, with the page's XSRF token): typing whole answers into
a code editor that indents and closes brackets on its own would test the editor, not the
class.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

SHOTS = Path(__file__).resolve().parents[2] / "artifacts" / "classroom"

SAVE = """async ([path, sources, whole]) => {
    const base = JSON.parse(document.getElementById('jupyter-config-data').textContent).baseUrl;
    const xsrf = document.cookie.split('; ').find(c => c.startsWith('_xsrf='));
    const headers = {'X-XSRFToken': decodeURIComponent(xsrf.slice(6)),
                     'Content-Type': 'application/json'};
    const url = base + 'api/contents/' + path;
    let nb = whole;
    if (nb === null) {
        nb = (await (await fetch(url, {headers})).json()).content;
        for (const cell of nb.cells) {
            const id = (cell.metadata.nbgrader || {}).grade_id;
            if (id in sources) cell.source = sources[id];
        }
    }
    const put = await fetch(url, {method: 'PUT', headers,
                                  body: JSON.stringify({type: 'notebook', format: 'json',
                                                        content: nb})});
    return put.status;
}"""
WAIT_S = 180_000  # ms: a spawn, a fetch or a cell on a busy 2-core machine


class Student:
    """One student's browser tab at the hub."""

    def __init__(self, context: Any, hub: str, name: str, password: str):
        self.page = context.new_page()
        self.hub, self.name, self.password = hub, name, password

    def shot(self, what: str) -> Path:
        """A screenshot in artifacts/classroom/ (look at it when a step fails)."""
        SHOTS.mkdir(parents=True, exist_ok=True)
        path = SHOTS / f"{self.name}-{what}.png"
        self.page.screenshot(path=str(path))
        return path

    def log_in(self) -> None:
        page = self.page
        page.goto(f"{self.hub}/hub/login", timeout=WAIT_S)
        page.fill("input#username_input", self.name)
        page.fill("input#password_input", self.password)
        page.click("#login_submit")
        page.wait_for_url(f"**/user/{self.name}/lab**", timeout=WAIT_S)
        page.wait_for_selector(".lm-MenuBar-itemLabel:text-is('Nbgrader')", timeout=WAIT_S)

    def assignments(self) -> None:
        """Open (or refresh) the Assignments panel."""
        page = self.page
        page.goto(f"{self.hub}/user/{self.name}/lab", timeout=WAIT_S)
        page.wait_for_selector(".lm-MenuBar-itemLabel:text-is('Nbgrader')", timeout=WAIT_S)
        page.click(".lm-MenuBar-itemLabel:text-is('Nbgrader')")
        page.click(".lm-Menu-itemLabel:text-is('Assignment List')")
        page.wait_for_selector("#released_assignments_list .list_item, "
                               "#released_assignments_list_placeholder:visible",
                               timeout=WAIT_S)

    def _row(self, panel: str, assignment: str) -> Any:
        return self.page.locator(f"#{panel} > .list_item", has_text=assignment).first

    def fetch(self, assignment: str) -> None:
        self._row("released_assignments_list", assignment).locator(
            "button", has_text="Fetch").click()
        self._row("fetched_assignments_list", assignment).wait_for(timeout=WAIT_S)

    def submit(self, assignment: str) -> None:
        self._row("fetched_assignments_list", assignment).locator(
            "button", has_text="Submit").click()
        self._row("submitted_assignments_list", assignment).wait_for(timeout=WAIT_S)

    def fetch_feedback(self, assignment: str) -> None:
        row = self._row("submitted_assignments_list", assignment)
        row.locator("button", has_text="Fetch Feedback").click()
        row.get_by_text("view feedback").first.wait_for(timeout=WAIT_S)

    def save(self, path: str, sources: dict[str, str] | None = None,
             notebook: dict[str, Any] | None = None) -> None:
        """Replace answer cells (by grade id) of ``path``, or write a whole new notebook."""
        status = self.page.evaluate(SAVE, [path, sources or {}, notebook])
        assert status in (200, 201), f"{self.name}: saving {path} answered {status}"

    def start_cell(self, path: str) -> None:
        """Open ``path`` and run its first cell (queued until the kernel is up)."""
        page = self.page
        page.goto(f"{self.hub}/user/{self.name}/lab/tree/{path}", timeout=WAIT_S)
        # the workspace keeps other notebooks open (hidden tabs): the visible one's cell
        editor = page.locator(".jp-Notebook .jp-Cell .jp-InputArea-editor >> visible=true").first
        editor.wait_for(timeout=WAIT_S)
        # a cell run before the kernel answers is dropped: wait for the status bar's "Idle"
        page.locator(".jp-StatusBar-Widget", has_text="Idle").first.wait_for(timeout=WAIT_S)
        editor.click()
        page.keyboard.press("Shift+Enter")

    def cell_output(self, pattern: str) -> re.Match[str]:
        """Wait for an output matching ``pattern`` (a regular expression) and return it."""
        locator = self.page.locator(".jp-OutputArea-output", has_text=re.compile(pattern))
        try:
            locator.first.wait_for(timeout=WAIT_S)
        except Exception:
            self.shot("no-output")
            raise
        found = re.search(pattern, locator.first.inner_text())
        assert found is not None
        return found
