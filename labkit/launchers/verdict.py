"""Which rank to blame: the supervisor's rules for naming the root cause of a failed run.

Teaches: in a collective, one rank's failure makes every peer fail too ("connection reset
by peer", "broken pipe"), often *before* the culprit's own report arrives. So the verdict
ranks what the supervisor saw: (1) a real exception, (2) a rank that died without a word
(exit code -- 0 included, when it never handed in a result -- or a signal), (3) only then
the earliest echo. For a hang, the rank that is *not* blocked in communication is the one
the others wait for (the pattern of PyTorch's ``MultiProcessTestCase`` and NCCL's flight
recorder) -- unless every rank was still finishing steps when the limit hit: then the run
is slow, not stuck, and the message says so and how to raise the limit. Torch-free.
"""

from __future__ import annotations

import signal

from labkit.base.errors import RankFailure, RunTimeout

# Errors a rank raises only because *another* rank failed first.
ECHO_MARKERS = ("Connection closed by peer", "Connection reset by peer", "Broken pipe",
                "Socket Timeout", "Connection refused", "ECONNRESET", "EPIPE",
                "Timed out waiting", "NCCL communicator was aborted")
LOG_TAIL = 3000  # characters of a silently dead rank's output shown with its failure
TORCH_COMM_FILES = ("torch/distributed/distributed_c10d.py", "torch/nn/parallel/distributed.py")
"""Where a rank's innermost Python frame is when it waits in communication that torch
issued itself, outside labkit's traced ``Comm`` (whose calls set the board's flag): DDP's
parameter broadcast at construction and its bucket rebuild (a broadcast from rank 0) in
the forward of the second step, a barrier or an object gather of the group's set-up."""


def pick_failure(errors: list[tuple[int, RankFailure]], deaths: list[RankFailure]
                 ) -> tuple[RankFailure, list[RankFailure]]:
    """The root cause and the rest: a real exception, else a silent death, else the
    earliest echo. ``errors`` are (monotonic ns, failure) pairs."""
    ordered_errors = [f for _, f in sorted(errors, key=lambda x: x[0])]
    real = [f for f in ordered_errors
            if not any(m in f.message + f.traceback for m in ECHO_MARKERS)]
    ordered = real + deaths + [f for f in ordered_errors if f not in real]
    return ordered[0], ordered[1:]


def silent_death(rank: int, code: int, log: str) -> RankFailure:
    """A rank that exited without reporting: by a signal, or with an exit code (0 too)."""
    if code < 0:
        failure = RankFailure(rank, "signal", f"rank {rank} was killed by "
                              f"{signal.Signals(-code).name}")
    elif code == 0:
        failure = RankFailure(rank, "exit", f"rank {rank} exited with code 0 without reporting "
                              f"its result (did its code call os._exit(0) or sys.exit() "
                              f"before returning?)")
    else:
        failure = RankFailure(rank, "exit", f"rank {rank} exited with code {code} without "
                              f"reporting an error")
    tail = log[-LOG_TAIL:]
    failure.traceback = f"(last output of rank {rank})\n{tail}" if tail.strip() else ""
    return failure


def waits_in_torch(stack: str) -> bool:
    """Whether a ``faulthandler`` dump shows a thread whose innermost frame is inside a
    torch.distributed call (``TORCH_COMM_FILES``): that rank waits for its peers even though
    its board flag is 0. Only the innermost frame counts: a rank computing inside DDP's
    forward has DDP's frames further out, but its innermost one is in the model."""
    innermost = True
    for line in stack.splitlines():
        text = line.strip()
        if text.startswith(("Thread 0x", "Current thread 0x")):
            innermost = True
        elif text.startswith("File ") and innermost:
            innermost = False
            if any(name in text.replace("\\", "/") for name in TORCH_COMM_FILES):
                return True
    return False


def _raise_hint(timeout_s: float, slow: bool) -> str:
    more = max(2 * timeout_s, timeout_s + 60)
    how = (f"timeout_s={more:g} (labkit.run, labkit.launch, labkit.Pool) or --timeout "
           f"{more:g} (labkit run)")
    return f"raise the limit: {how}" if slow else f"if it is only slow, raise the limit: {how}"


def _doing(rank: int, blocked: bool, step: int, idle_s: float | None) -> str:
    where = "in a communication call" if blocked else "computing (outside communication)"
    since = "" if idle_s is None else f", its last step {idle_s:.1f} s ago"
    return f"rank {rank} at step {step}, {where}{since}"


def still_training(steps: dict[int, int], idle_s: dict[int, float | None],
                   busy_s: dict[int, float | None]) -> bool:
    """Whether every running rank was still finishing steps when the limit hit: each made
    one within three of its own mean step times plus a second. ``steps[r]``: the steps rank
    r finished in ``busy_s[r]`` seconds (from its first step's start to its last step's
    end: start-up is not step time). A hung rank's mean is that of its healthy steps, so
    its silence stands out."""
    for r, step in steps.items():
        idle, busy = idle_s.get(r), busy_s.get(r)
        if idle is None or busy is None or step < 1 or idle > 3 * busy / step + 1.0:
            return False
    return bool(steps)


def hang(timeout_s: float, running: list[int], blocked: dict[int, bool],
         steps: dict[int, int], stacks: dict[int, str],
         idle_s: dict[int, float | None] | None = None,
         busy_s: dict[int, float | None] | None = None,
         done: dict[int, int] | None = None) -> RunTimeout:
    """The timeout error, saying what each rank was doing and at which step, and how to
    raise the limit. ``blocked[r]``: rank r's board flag (inside labkit's communication
    calls); a stack waiting inside torch.distributed counts too (``waits_in_torch``).
    ``idle_s[r]``: seconds since its step counter last moved; ``busy_s[r]``: seconds from
    its first step's start to that last move; ``done[r]``: the steps it finished in that
    time (default: ``steps[r]``, a run that started at step 0). None where the launcher
    cannot tell.

    A run whose ranks were all still finishing steps is *slow*, not stuck: it is reported
    as such. Otherwise the suspect is the rank stuck outside communication while others
    wait for it in communication."""
    idle_s = idle_s or {}
    busy_s = busy_s or {}
    blocked = {r: bool(blocked[r]) or waits_in_torch(stacks.get(r, "")) for r in running}
    states = "; ".join(_doing(r, blocked[r], steps[r], idle_s.get(r)) for r in running)
    stuck = [r for r in running if not blocked[r]]
    waiting = [r for r in running if blocked[r]]
    suspect: int | None
    counts = done if done is not None else steps
    slow = still_training({r: counts.get(r, 0) for r in running}, idle_s, busy_s)
    if slow:
        suspect = None
        why = (f"the run was still training, not stuck ({states}); it needs more than "
               f"{timeout_s:g} s")
    elif stuck and waiting:
        suspect = stuck[0]
        why = (f"rank {suspect} stopped making progress at step {steps[suspect]} outside any "
               f"communication call, while rank(s) {', '.join(map(str, waiting))} waited for "
               f"it ({states})")
    else:
        suspect = running[0] if len(running) == 1 else None
        why = f"no rank finished a step lately ({states})" if running else "no rank was running"
    message = (f"run timed out after {timeout_s:g} s: {why}; ranks still running: "
               f"{', '.join(map(str, running)) or 'none'}; {_raise_hint(timeout_s, slow)}")
    text = "\n\n".join(f"--- rank {r} (step {steps[r]}) ---\n{stacks[r].strip()}"
                       for r in running)
    return RunTimeout(RankFailure(suspect, "timeout", message, text))
