"""The strategy registry survives a Ctrl-C while it fills (issue 25, item 4).

A student who stops the first ``labkit.run`` of a kernel 0.1 s in interrupts the discovery
of ``labkit.strategies``: before the fix, every later run in that kernel failed with
"strategy 'ddp' is not registered". Here a fresh interpreter is interrupted at every
line the discovery executes, one point per try (a ``KeyboardInterrupt`` raised from a trace
function lands exactly there, as a signal would), and after each interrupt the next call
must find every strategy.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from labkit.config import registry

pytestmark = pytest.mark.lesson00

PROBE = r"""
import importlib, json, sys
from labkit.config import registry

def reset():
    for name in [m for m in sys.modules if m.startswith("labkit.strategies")]:
        del sys.modules[name]
    registry._REGISTRY.clear()
    getattr(registry, "_ORIGIN", {}).clear()
    registry._discovered = False

def interrupt_at(n):
    seen = [0]
    def tracer(frame, event, arg):
        if not frame.f_globals.get("__name__", "").startswith("labkit.strategies"):
            return None
        if event == "line":
            seen[0] += 1
            if seen[0] == n:
                raise KeyboardInterrupt
        return tracer
    return tracer

results = []
n = 1
while True:
    reset()
    sys.settrace(interrupt_at(n))
    try:
        registry.names()
        hit = False
    except KeyboardInterrupt:
        hit = True
    finally:
        sys.settrace(None)
    after = registry.names()  # the next call, as the student's next run
    results.append([n, hit, after])
    if not hit:  # n is past the last line the discovery runs: every point was tried
        break
    n += 1 if n < 40 else 7  # every line of the first packages, then every 7th
print(json.dumps(results))
"""


def test_an_interrupt_anywhere_in_discovery_leaves_the_next_call_every_strategy() -> None:
    """Interrupted at each line of the strategy packages' imports (fresh interpreter),
    ``registry.names()`` raises KeyboardInterrupt and the next call lists every strategy;
    a package re-imported after an interrupt never counts as registered twice."""
    everything = registry.names()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                         env=env, timeout=300, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    results = json.loads(out.stdout.strip().splitlines()[-1])
    interrupted = [r for r in results if r[1]]
    assert len(interrupted) >= 20, f"only {len(interrupted)} interrupt points were reached"
    for n, _, after in results:
        assert after == everything, f"interrupt at line {n} of the discovery left {after}"
