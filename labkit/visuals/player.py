"""An animation as a self-contained HTML/JavaScript player, its frames counted on a bar.

Matplotlib's ``Animation.to_jshtml`` renders every frame to a PNG before the cell shows
anything: lesson 01's ring (about 40 frames) took 5 s on a quiet 2-core laptop, in silence.
``jshtml`` makes the same player through the same ``HTMLWriter`` (the same frame rate and end
mode ``to_jshtml`` picks) and counts the frames on a ``labkit.base.progress`` bar, which shows
where one can see it once the drawing has lasted two seconds.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from labkit.base.progress import Progress


def jshtml(anim: Any, what: str, default_mode: str | None = None,
           progress: bool | None = None) -> str:
    """``anim.to_jshtml(default_mode=...)``, with a bar "drawing ``what``" over its frames."""
    from matplotlib.animation import HTMLWriter

    fps: Any = 1000 / anim._interval if hasattr(anim, "_interval") else None  # as to_jshtml
    mode = default_mode or ("loop" if getattr(anim, "_repeat", False) else "once")
    with Progress(f"drawing {what}", unit="frame", enabled=progress) as shown, \
            tempfile.TemporaryDirectory(prefix="labkit-anim-") as tmp:

        def drawn(frame: int, total: int | None) -> None:
            if frame == 0 and total:
                shown.restart(f"drawing {what}", total=total)
            shown.step()

        path = Path(tmp, "player.html")
        anim.save(str(path), writer=HTMLWriter(fps=fps, embed_frames=True, default_mode=mode),
                  progress_callback=drawn)
        return path.read_text()
