"""An animation's player, drawn with its frames counted (``labkit.visuals.player``): the
same HTML ``to_jshtml`` writes, and a bar (here plain lines) over the frames."""

from __future__ import annotations

import re

import matplotlib.pyplot as plt
from matplotlib.animation import FuncAnimation

from labkit.visuals.player import jshtml


def _anim(repeat: bool) -> FuncAnimation:
    fig, ax = plt.subplots(figsize=(2, 2), dpi=40)
    (line,) = ax.plot([0, 1], [0, 0])

    def draw(k: int) -> None:
        line.set_ydata([0, k])

    anim = FuncAnimation(fig, draw, frames=3, interval=250, repeat=repeat)
    plt.close(fig)
    return anim


def _without_ids(html: str) -> str:
    return re.sub(r"[0-9a-f]{32}", "ID", html)


def test_the_player_is_to_jshtmls_and_its_frames_are_counted(capsys) -> None:
    for repeat, mode in ((True, None), (False, "once"), (True, "reflect")):
        ours = jshtml(_anim(repeat), "three frames", mode, progress=True)
        theirs = _anim(repeat).to_jshtml(default_mode=mode)
        assert _without_ids(ours) == _without_ids(theirs), (repeat, mode)
    out, err = capsys.readouterr()
    assert out == ""
    assert "drawing three frames: 3/3" in err.splitlines(), err


def test_nothing_is_said_off_a_terminal_unless_asked(capsys) -> None:
    jshtml(_anim(False), "three frames")
    assert capsys.readouterr() == ("", "")
