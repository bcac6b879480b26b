"""Submissions that render inert: no student script runs in the formgrader or the feedback page.

nbgrader's formgrader and ``generate_feedback`` render a graded notebook with nbconvert's
HTML exporter, which passes markdown's raw HTML, ``javascript:`` links and ``text/html`` or
``application/javascript`` outputs through as they are: a markdown cell ``<img src=x
onerror=...>`` runs with the instructor's rights when she opens the submission, and with
the student's in the feedback. nbconvert's own ``SanitizeHTML`` escapes the HTML in a
markdown cell's *source* but leaves markdown's links (``[x](javascript:...)``) to its
renderer, which lets every scheme through; so labkit judges the HTML as it will be rendered.

``SanitizeStudentContent`` runs in autograde right after the notebook ran (the stored
autograded notebook, which the formgrader renders, holds no active content) and again in
``generate_feedback``; ``nbgrader_config.py`` also sets ``HTMLExporter.sanitize_html``, the
exporter's own cleaning, as a second wall. Per cell:

1. a markdown or raw cell is rendered the way nbconvert renders it; when the HTML holds
   active content (a script, an event handler, a frame, object or form, an SVG or MathML
   island, a URL whose scheme is not http(s), mailto or an image's ``data:``), the cell
   becomes a note followed by its source as escaped text;
2. outputs keep plain text, PNG / JPEG / GIF, LaTeX and JSON; HTML, markdown and SVG only
   when they hold no active content (else their text is kept as ``text/plain``); every
   other type (JavaScript, widgets) is dropped;
3. attachments other than PNG / JPEG / GIF images are dropped;
4. text that cannot be written as UTF-8 (a lone surrogate such as ``"\\ud800"``) is escaped
   (``escape_invalid_text``), so the notebook can always be saved and scored.
"""

from __future__ import annotations

import html
import re
from html.parser import HTMLParser
from typing import Any

from nbconvert.filters import markdown2html_mistune
from nbconvert.preprocessors import Preprocessor
from traitlets import Bool

ACTIVE_TAGS = frozenset({
    "script", "iframe", "frame", "frameset", "object", "embed", "applet", "svg", "math", "form",
    "base", "meta", "link", "style", "template", "portal", "foreignobject", "set", "animate",
    "animatemotion", "animatetransform", "handler", "listener", "noscript", "xml", "import"})
"""Tags that run, load or re-frame content (in SVG data ``svg`` and ``style`` are allowed)."""
URL_ATTRIBUTES = frozenset({
    "href", "src", "xlink:href", "action", "formaction", "data", "poster", "background",
    "lowsrc", "dynsrc", "codebase", "cite", "longdesc", "usemap", "ping", "srcset", "to",
    "values", "from", "by"})
SAFE_SCHEMES = ("http", "https", "mailto")
SAFE_DATA = re.compile(r"data:image/(png|jpeg|jpg|gif|webp)[;,]")
SAFE_OUTPUTS = frozenset({"text/plain", "text/latex", "application/json", "image/png",
                          "image/jpeg", "image/gif"})
CHECKED_OUTPUTS = {"text/html": "html", "text/markdown": "markdown", "image/svg+xml": "svg"}
NOTE = ("*labkit removed active content from this cell ({why}); what the student wrote "
        "is shown as text:*\n\n")


class _Finder(HTMLParser):
    """Collects the reasons a piece of HTML is active (entities already decoded)."""

    def __init__(self, allowed: frozenset[str]) -> None:
        super().__init__(convert_charrefs=True)
        self.allowed = allowed
        self.found: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in ACTIVE_TAGS and tag not in self.allowed:
            self.found.append(f"<{tag}>")
        for name, value in attrs:
            name = name.lower()
            if name.startswith("on"):
                self.found.append(f"{name}= handler")
            elif name in ("srcdoc", "formaction"):
                self.found.append(f"{name}=")
            elif name in URL_ATTRIBUTES and value and not _safe_url(value):
                self.found.append(f"{name}={_scheme(value)}: link")
            elif name == "style" and value and re.search(r"expression\s*\(|script:",
                                                         value, re.I):
                self.found.append("script in a style")

    handle_startendtag = handle_starttag


def _scheme(url: str) -> str:
    """The scheme of ``url`` as a browser reads it (whitespace and control characters dropped)."""
    plain = re.sub(r"[\x00-\x20\x7f]+", "", url).lower()
    match = re.match(r"([a-z][a-z0-9+.\-]*):", plain)
    return match.group(1) if match else ""


def _safe_url(url: str) -> bool:
    scheme = _scheme(url)
    if not scheme:
        return True  # relative, fragment, or a path
    if scheme == "data":
        return bool(SAFE_DATA.match(re.sub(r"[\x00-\x20\x7f]+", "", url).lower()))
    return scheme in SAFE_SCHEMES


def active_content(markup: str, *, svg: bool = False) -> list[str]:
    """Why ``markup`` (HTML, or SVG when ``svg``) would run or load code; empty when inert."""
    finder = _Finder(frozenset({"svg", "style"}) if svg else frozenset())
    finder.feed(markup)
    finder.close()
    return sorted(set(finder.found))


def rendered_active(markdown: str) -> list[str]:
    """Why the HTML nbconvert renders from ``markdown`` would be active; empty when inert."""
    return active_content(markdown2html_mistune(markdown))


def as_text(source: str, why: list[str]) -> str:
    """Markdown that shows ``source`` verbatim and inert, after a note naming ``why``."""
    return NOTE.format(why=html.escape(", ".join(why))) + "<pre>" + html.escape(source) + "</pre>\n"


def escape_invalid_text(value: Any) -> tuple[Any, int]:
    """``value`` (nested dicts and lists of a notebook) with lone surrogates escaped as
    ``\\udXXX`` text, and how many strings changed."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
            return value, 0
        except UnicodeEncodeError:
            return "".join(f"\\u{ord(ch):04x}" if 0xD800 <= ord(ch) <= 0xDFFF else ch
                           for ch in value), 1
    changed = 0
    if isinstance(value, dict):
        for key in list(value):
            value[key], n = escape_invalid_text(value[key])
            new_key, m = escape_invalid_text(key)
            if m:
                value[new_key] = value.pop(key)
            changed += n + m
    elif isinstance(value, list):
        for i, item in enumerate(value):
            value[i], n = escape_invalid_text(item)
            changed += n
    return value, changed


def _text(data: Any) -> str:
    return "".join(data) if isinstance(data, list) else str(data)


def sanitize_outputs(outputs: list[Any]) -> list[str]:
    """Drop or neutralise active outputs in place; what was removed, in words."""
    removed: list[str] = []
    for out in outputs:
        data = out.get("data")
        if not isinstance(data, dict):
            continue  # stream and error outputs are rendered as escaped text
        for key in list(data):
            kind = CHECKED_OUTPUTS.get(key)
            if key in SAFE_OUTPUTS:
                continue
            body = _text(data[key])
            why = ([] if kind is None else rendered_active(body) if kind == "markdown"
                   else active_content(body, svg=kind == "svg"))
            if kind is None or why:
                del data[key]
                removed.append(f"{key} output" + (f" ({', '.join(why)})" if why else ""))
                if kind in ("html", "markdown") and "text/plain" not in data:
                    data["text/plain"] = body
        if isinstance(out.get("metadata"), dict):
            out["metadata"] = {k: v for k, v in out["metadata"].items() if k in data}
    return removed


class SanitizeStudentContent(Preprocessor):  # type: ignore[misc]
    """Leave no active content in a notebook's markdown, raw cells, outputs and attachments."""

    enabled = Bool(True).tag(config=True)  # nbconvert preprocessors default to off

    def preprocess_cell(self, cell: Any, resources: Any, index: int) -> tuple[Any, Any]:
        escape_invalid_text(cell)
        if cell.cell_type in ("markdown", "raw"):
            source = _text(cell.source)
            why = (rendered_active(source) if cell.cell_type == "markdown"
                   else active_content(source))
            if why:
                self.log.warning("cell %d: active content removed (%s)", index, ", ".join(why))
                cell.source = as_text(source, why)
            attachments = cell.get("attachments") or {}
            for name in list(attachments):
                bundle = attachments[name]
                if not isinstance(bundle, dict) or set(bundle) - {"image/png", "image/jpeg",
                                                                  "image/gif"}:
                    self.log.warning("cell %d: attachment %r removed", index, name)
                    del attachments[name]
        elif cell.cell_type == "code":
            for what in sanitize_outputs(cell.get("outputs", [])):
                self.log.warning("cell %d: %s removed", index, what)
        return cell, resources
