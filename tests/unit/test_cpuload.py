"""Other programs' CPU, the lesson's own tree taken out (``labkit.base.cpuload``), and the
sentence a lesson writes from it (``labkit.lessons.machine``): a quiet laptop whose load
average still counts the lesson's own ranks is not called busy."""

from __future__ import annotations

import subprocess
import sys

from labkit.base.cpuload import CpuSample, busy_limit, cpu_sample, others_cores
from labkit.lessons import machine
from labkit.lessons.machine import NOT_DEDICATED, Load, why_not

BURN = ("import subprocess, sys, time\n"
        "kids = [subprocess.Popen([sys.executable, '-c', sys.argv[1], '']) ] if sys.argv[2:] "
        "else []\n"
        "while time.process_time() < 0.5:\n    pass\n"
        "for k in kids:\n    k.wait()\n")
"""Half a second of CPU (not of wall: the same under any load), and as much again in a child
when asked: a rank and the process it started."""


def test_others_are_everyones_cpu_less_ours_per_second_of_wall() -> None:
    before, after = CpuSample(100.0, 10.0, 5.0), CpuSample(103.0, 11.5, 6.0)
    assert others_cores(before, after) == 1.5
    assert others_cores(before, CpuSample(100.5, 11.5, 6.0)) == 0.0  # rounding never < 0
    assert busy_limit(1) == 0.25 and busy_limit(64) == 0.15 * 64  # a quarter core, or 15 %


def test_our_children_and_theirs_count_as_ours_once_reaped() -> None:
    before = cpu_sample()
    subprocess.run([sys.executable, "-c", BURN, BURN, "child too"], check=True)
    ours = cpu_sample().ours_s - before.ours_s
    assert ours >= 0.95, f"a child and grandchild burned 1 s of CPU; ours grew by {ours:.2f} s"
    alone = cpu_sample(tree=False)
    assert alone.ours_s < cpu_sample().ours_s  # tree=False: this process's threads only


def test_busy_reads_other_programs_not_the_load_average() -> None:
    quiet_after_our_ranks = Load(1.8, 2, others=0.05)
    assert not quiet_after_our_ranks.busy
    assert quiet_after_our_ranks.text() == "other programs used 0.1 of 2 cores (load average 1.8)"
    hogged = Load(3.9, 2, others=1.7)
    assert hogged.busy
    said = why_not(hogged, 2)
    assert said.startswith("2 ranks and their communication threads shared 2 cores and other "
                           "programs used 1.7 of 2 cores")
    assert said.endswith(NOT_DEDICATED)
    assert why_not(quiet_after_our_ranks, 2).startswith(
        "2 ranks and their communication threads shared 2 cores: ")
    assert why_not(quiet_after_our_ranks, 4).startswith("4 ranks shared 2 cores: ")
    assert Load(1.5, 2).busy and not Load(0.5, 2).busy  # not read: the load average decides
    assert Load(float("nan"), 2).text() == "2 cores"


def test_a_reading_is_reused_for_a_while_unless_asked_fresh(monkeypatch) -> None:
    readings = iter([0.0, 1.2])
    monkeypatch.setattr(machine, "others_now", lambda: next(readings))
    monkeypatch.setattr(machine, "_LAST", [])
    first = machine.load_now()
    assert machine.load_now() is first and not first.busy
    assert machine.load_now(fresh=True).busy
