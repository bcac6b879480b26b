"""Resume and crash-safety bars of lesson 07, measured.

1. ``--kills 10``: kill rank 1 at a random step of a checkpointed ddp run, resume, and count
   runs whose final weights AND optimizer state equal an uninterrupted run bit for bit
   (expected 10/10).
2. ``--save-kills 20``: kill a rank at a random instant *during* a checkpoint save, then
   load the latest complete checkpoint and count loads that are not exactly one earlier save
   (expected 0 partial loads).
Usage: python bench/bench_resume.py [--kills 10] [--save-kills 20] [--seed 0]
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import tempfile
import threading
import time
from pathlib import Path

import torch

import labkit
from labkit.base.errors import RunFailed
from labkit.rank.context import RankContext
from labkit.train.checkpoint import complete_steps, load, save

STEPS = 12
SHAPE = (4096, 2048)  # 32 MB: a save lasts long enough for a kill to land inside it
RUN = {"strategy": "ddp", "world_size": 2, "steps": STEPS, "optimizer": "momentum", "lr": 0.02,
           "progress": False, "threads_per_rank": 1, "timeout_s": 120}


def _final(root: Path) -> dict[str, torch.Tensor]:
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    out = root.with_suffix(".pt")
    dcp_to_torch_save(str(root / f"step_{STEPS:08d}"), str(out))
    flat: dict[str, torch.Tensor] = {}

    def walk(d: object, pre: str) -> None:
        if isinstance(d, dict):
            for k, v in d.items():
                walk(v, f"{pre}{k}/")
        elif isinstance(d, torch.Tensor):
            flat[pre] = d
    walk(torch.load(out, weights_only=False), "")
    return flat


def resume_trials(n: int, rng: random.Random, tmp: Path) -> int:
    ref = tmp / "ref"
    labkit.run(**RUN, options={"checkpoint_dir": str(ref), "checkpoint_every": STEPS})
    want = _final(ref)
    same = 0
    for i in range(n):
        root, step, every = tmp / f"t{i}", rng.randrange(1, STEPS), rng.choice([2, 3, 4])
        opts = {"checkpoint_dir": str(root), "checkpoint_every": every}
        try:
            labkit.run(**RUN, options=opts, inject_fault=f"1:{step}:kill")
        except RunFailed:
            pass
        res = labkit.run(**RUN, options={**opts, "resume": True})
        if STEPS not in complete_steps(root):  # make sure the final state is on disk
            raise RuntimeError(f"trial {i}: no final checkpoint")
        got = _final(root)
        ok = got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)
        same += ok
        print(f"  trial {i}: kill at step {step}, every {every}, resumed from "
              f"{res.metrics['resumed_from_step']}: {'identical' if ok else 'DIFFERENT'}")
    return same


def _save_with_random_kill(ctx: RankContext, root: str, seed: int) -> None:
    """Saves 1 and 2 complete (their duration is measured); save 3 is killed at a random
    instant between its start and 1.2x that duration, on a rank chosen by the seed."""
    state = {"w": torch.zeros(SHAPE)}
    took = 0.0
    for step in range(1, 4):
        state["w"].fill_(float(step))
        if step == 3 and ctx.rank == seed % ctx.world_size:
            delay = random.Random(seed).uniform(0.0, 1.2 * took)
            threading.Timer(delay, os.kill, (os.getpid(), signal.SIGKILL)).start()
        t0 = time.monotonic()
        save(ctx, root, step, state)
        took = time.monotonic() - t0
    time.sleep(5)  # the killer fires even when the save was faster than its delay


def _load(ctx: RankContext, root: str) -> list[float]:
    state = {"w": torch.full(SHAPE, -1.0)}
    meta, _ = load(ctx, root, complete_steps(root)[-1], state)
    return [float(meta["step"]), float(state["w"].min()), float(state["w"].max())]


def save_kill_trials(n: int, tmp: Path) -> int:
    partial = 0
    for i in range(n):
        root = str(tmp / f"s{i}")
        try:
            labkit.launch(_save_with_random_kill, 2, root, i, timeout_s=60, trace=False)
        except RunFailed:
            pass
        res = labkit.launch(_load, 2, root, timeout_s=60, trace=False).results
        bad = [r for r in res if not (r[1] == r[2] == r[0])]  # every value = the saved step
        partial += bool(bad)
        leftover = sorted(p.name for p in Path(root).glob("*.partial"))
        print(f"  save-kill {i}: complete {complete_steps(root)}, partial dirs {leftover} -> "
              f"loaded step {res[0][0]:g}"
              f"{' PARTIAL' if bad else ''}")
    return partial


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--kills", type=int, default=10)
    p.add_argument("--save-kills", type=int, default=20)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    rng = random.Random(args.seed)
    with tempfile.TemporaryDirectory() as d:
        t0 = time.monotonic()
        same = resume_trials(args.kills, rng, Path(d))
        print(f"bit-identical resumes: {same}/{args.kills} ({time.monotonic() - t0:.0f} s)")
        t0 = time.monotonic()
        partial = save_kill_trials(args.save_kills, Path(d))
        print(f"partial loads after a kill during save: {partial}/{args.save_kills} "
              f"({time.monotonic() - t0:.0f} s)")
    return 0 if same == args.kills and partial == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
