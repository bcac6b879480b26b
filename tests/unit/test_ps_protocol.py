"""The parameter server's rules without processes: the consistency gate driven by simulated
workers of random speed, shard bounds, and the validation of ``labkit run ps`` options."""

from __future__ import annotations

import heapq
import random

import pytest

from labkit.base.errors import ConfigError
from labkit.config.run import RunConfig
from labkit.strategies.ps import PSOptions
from labkit.strategies.ps.protocol import Consistency, Gate, shard_bounds
from labkit.strategies.ps.records import PSMetrics, smoothed, staleness_stats, time_to_loss

pytestmark = pytest.mark.lesson11


def simulate(consistency: Consistency, workers: int, steps: int, bound: int = 0,
             seed: int = 0, slow: int | None = None, equal: bool = False,
             finish: list[float] | None = None) -> tuple[Gate, list[int], list[int]]:
    """Workers pull, compute for a random time (``equal``: 1 unit each; worker ``slow`` 5x
    longer), push, repeat. Returns the gate, every gradient's staleness and the version
    after each update; ``finish`` gets the time the last gradient arrived."""
    rng = random.Random(seed)
    gate = Gate(consistency, workers, bound)
    events: list[tuple[float, int, str, int]] = []  # (time, seq, what, worker)
    seq = 0
    step = [0] * workers
    stale, versions = [], []
    read_at: dict[int, int] = {}

    def later(t: float, what: str, w: int) -> None:
        nonlocal seq
        seq += 1
        heapq.heappush(events, (t, seq, what, w))

    for w in range(workers):
        later(rng.random(), "pull", w)
    while events:
        now, _, what, w = heapq.heappop(events)
        if finish is not None:
            finish[:] = [now]
        if what == "pull":
            gate.request(w, step[w])
        elif what == "push":
            stale.append(gate.pushed(w, read_at.pop(w)))
            if gate.apply_now():
                gate.applied()
                versions.append(gate.version)
            step[w] += 1
            if step[w] < steps:
                later(now + (0.0 if equal else 0.01), "pull", w)
            else:
                gate.finished(w)
        for who, _step, version in gate.grants():
            read_at[who] = version
            cost = (1.0 if equal else rng.uniform(0.5, 1.5)) * (5 if who == slow else 1)
            later(now + cost, "push", who)
    return gate, stale, versions


def test_bsp_applies_one_update_per_step_and_nothing_is_ever_stale():
    gate, stale, versions = simulate(Consistency.BSP, workers=4, steps=12, slow=2)
    assert gate.all_done, "a worker never finished: the gate deadlocked"
    assert stale == [0] * (4 * 12)
    assert versions == list(range(1, 13))


def test_asp_applies_every_gradient_and_a_straggler_makes_stale_ones():
    gate, stale, _ = simulate(Consistency.ASP, workers=4, steps=12, slow=3)
    assert gate.all_done and gate.version == 4 * 12
    assert max(stale) > 0


@pytest.mark.parametrize("bound", [0, 1, 2, 3, 5])
@pytest.mark.parametrize("seed", range(6))
def test_ssp_keeps_every_read_within_s_clocks_of_the_slowest(bound, seed):
    """Ho et al. 2013: a worker at clock c reads only while the slowest is at c - s or
    later; with a 5x straggler, no deadlock and no read more than s clocks ahead."""
    gate, stale, _ = simulate(Consistency.SSP, workers=4, steps=10, bound=bound, seed=seed,
                              slow=seed % 4)
    assert gate.all_done, f"deadlock with s={bound}, seed {seed}"
    assert len(stale) == 40 and max(gate.clock_gaps) <= bound, (bound, max(gate.clock_gaps))
    assert len(gate.clock_gaps) == 40  # one read per step per worker


def test_ssp_with_s_0_paces_like_bsp_and_bounded_delay_0_runs_one_worker_at_a_time():
    """The issue's run: 3 equal workers, 20 steps of 1 time unit. BSP and SSP s = 0 take
    20 units; bounded delay K = 0 (labkit's old "ssp") serialises them: 60."""
    took = {}
    for name, consistency in (("bsp", Consistency.BSP), ("ssp", Consistency.SSP),
                              ("delay", Consistency.DELAY)):
        finish: list[float] = []
        gate, _, _ = simulate(consistency, workers=3, steps=20, bound=0, equal=True,
                              finish=finish)
        assert gate.all_done
        took[name] = finish[0]
    assert took["ssp"] == pytest.approx(took["bsp"], abs=1.0)
    assert took["bsp"] < 22 and took["delay"] > 59, took


@pytest.mark.parametrize("bound", [0, 1, 2, 3, 5])
@pytest.mark.parametrize("seed", range(6))
def test_bounded_delay_never_exceeds_its_bound_in_updates_and_never_deadlocks(bound, seed):
    gate, stale, _ = simulate(Consistency.DELAY, workers=4, steps=10, bound=bound, seed=seed,
                              slow=seed % 4)
    assert gate.all_done, f"deadlock with K={bound}, seed {seed}"
    assert len(stale) == 40 and max(stale) <= bound, (bound, max(stale))


def test_bounded_delay_does_not_bound_the_clock_gap():
    """What tells the two rules apart: with K = 2, a fast worker laps the straggler by
    more than 2 clocks, which SSP with s = 2 never allows."""
    gaps = [max(simulate(Consistency.DELAY, workers=4, steps=10, bound=2, seed=seed,
                         slow=seed % 4)[0].clock_gaps) for seed in range(3)]
    assert max(gaps) > 2, gaps


def test_loose_bounds_behave_like_asp():
    """s or K large enough never refuses a pull: the same schedule as ASP."""
    _, asp, _ = simulate(Consistency.ASP, workers=3, steps=8, seed=4, slow=1)
    _, ssp, _ = simulate(Consistency.SSP, workers=3, steps=8, bound=1000, seed=4, slow=1)
    _, delay, _ = simulate(Consistency.DELAY, workers=3, steps=8, bound=1000, seed=4, slow=1)
    assert asp == ssp == delay


def test_gate_rejects_a_push_of_a_version_it_never_handed_out():
    gate = Gate(Consistency.ASP, workers=2)
    gate.request(0, 0)
    assert gate.grants() == [(0, 0, 0)]
    with pytest.raises(ValueError, match="version 3"):
        gate.pushed(0, 3)


def test_bsp_pull_for_the_next_step_does_not_block_a_late_pull_for_this_one():
    gate = Gate(Consistency.BSP, workers=2)
    gate.request(0, 0)
    gate.grants()
    gate.pushed(0, 0)
    gate.request(0, 1)  # worker 0 is a step ahead, waiting
    gate.request(1, 0)  # worker 1's first pull arrives behind it
    assert gate.grants() == [(1, 0, 0)]


@pytest.mark.parametrize("numel,servers", [(10, 3), (7, 7), (1000, 4), (5, 1)])
def test_shards_cover_the_vector_once_and_differ_by_at_most_one(numel, servers):
    bounds = [shard_bounds(numel, servers, s) for s in range(servers)]
    assert bounds[0][0] == 0 and bounds[-1][1] == numel
    assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:]))
    sizes = [hi - lo for lo, hi in bounds]
    assert max(sizes) - min(sizes) <= 1


def test_staleness_stats_histogram_and_per_worker_means():
    out = staleness_stats([[0, 1, 2, 1], [0, 0]], [[0, 1, 1, 0], [0, 1]], workers=2)
    assert out["staleness_hist"] == [3, 2, 1]
    assert out["max_staleness"] == 2 and out["mean_staleness"] == pytest.approx(4 / 6)
    assert out["mean_staleness_per_worker"] == [pytest.approx(1 / 3), pytest.approx(1.0)]


def test_time_to_loss_smooths_over_the_same_gradients_for_bsp_and_asp():
    assert smoothed([4, 2, 0], 2) == [4, 3, 1]
    asp = {"consistency": "asp", "workers": 2,
           "loss_vs_time": [[0.1, 3.0], [0.2, 0.5], [0.3, 0.4], [0.4, 0.3]]}
    assert time_to_loss(asp, 1.0, grads=2) == pytest.approx(0.3)  # not 0.2: one lucky batch
    bsp = dict(asp, consistency="bsp")
    assert time_to_loss(bsp, 1.0, grads=2) == pytest.approx(0.2)  # one update = 2 gradients
    assert time_to_loss(asp, 0.1, grads=2) is None


def test_combine_reports_the_json_contract():
    config = RunConfig(strategy="ps", world_size=3, options={"consistency": "ssp"})
    server = PSMetrics(role="server", server=0, grad_staleness=[0, 1, 2, 0],
                       grad_worker=[0, 1, 0, 1], update_t_s=[0.5, 1.0, 1.5, 2.0],
                       update_loss=[2.0, 1.5, 1.2, 1.0], num_params=10,
                       clock_gaps=[0, 0, 1, 2, 1])
    workers = [PSMetrics(role="worker", worker=i, pull_wait_s=0.1 * i) for i in range(2)]
    m = PSMetrics.combine([server, *workers], config)
    assert m["staleness_hist"] == [2, 1, 1] and m["max_staleness"] == 2
    assert m["staleness_bound"] == 2 and m["bound_unit"] == "clocks" and m["updates"] == 4
    assert m["clock_gap_hist"] == [2, 2, 1] and m["max_clock_gap"] == 2
    assert m["updates_per_s"] == pytest.approx(2.0)
    assert m["loss_per_update"] == [2.0, 1.5, 1.2, 1.0]
    assert m["loss_vs_time"][0] == [0.5, 2.0]
    assert m["pull_wait_s_per_worker"] == [0.0, 0.1]
    assert "grad_staleness" not in m and "role" not in m and "clock_gaps" not in m
    delay = RunConfig(strategy="ps", world_size=3,
                      options={"consistency": "bounded-delay", "delay": 1})
    m = PSMetrics.combine([server, *workers], delay)
    assert m["delay_bound"] == 1 and m["bound_unit"] == "updates" and "staleness_bound" not in m


@pytest.mark.parametrize("kwargs,needle", [
    ({"world_size": 4, "options": {"servers": 1, "workers": 2}}, "must equal servers (1)"),
    ({"world_size": 2, "options": {"servers": 2}}, "at least one worker"),
    ({"world_size": 4, "options": {"straggler": "0:3"}}, "straggler rank (0) must be a worker"),
    ({"world_size": 4, "options": {"straggler": "fast"}}, "RANK:FACTOR"),
    ({"world_size": 4, "options": {"straggler": "2:0.5"}}, "factor"),
    ({"world_size": 4, "options": {"consistency": "bsp", "staleness": 2}}, "bound of ssp"),
    ({"world_size": 4, "options": {"consistency": "ssp", "delay": 2}},
     "--consistency bounded-delay --delay 2"),
    ({"world_size": 4, "options": {"consistency": "ssp", "staleness": -1}},
     "staleness (-1) must be >= 0 and <= 1000 clocks"),
    ({"world_size": 4, "options": {"straggler": "1:inf"}}, "must be a finite number >= 1"),
    ({"world_size": 4, "options": {"straggler": "1:1e300"}}, "must be >= 1 and <= 100"),
    ({"world_size": 4, "options": {"consistency": "eventual"}}, "bsp, asp, ssp, bounded-delay"),
    ({"world_size": 3, "optimizer": "lamb"}, "sgd, momentum, adam"),
    ({"world_size": 3, "backend": "nccl"}, "backend"),
])
def test_bad_ps_settings_are_refused_before_any_process_starts(kwargs, needle):
    with pytest.raises(ConfigError) as err:
        RunConfig(strategy="ps", **kwargs)
    assert needle in str(err.value)


def test_ps_defaults_and_the_world_size_the_flags_imply():
    from labkit.cli import build_parser
    from labkit.config.flags import config_from_args

    assert PSOptions(consistency="ssp").bound == 2
    assert PSOptions(consistency="bounded-delay", delay=0).bound == 0
    assert RunConfig(strategy="ps", backend="auto").resolved_backend() == "gloo"
    args, extra = build_parser().parse_known_args(
        ["run", "ps", "--workers", "3", "--servers", "1", "--consistency", "ssp",
         "--staleness", "2"])
    config = config_from_args(args, extra)
    assert config.world_size == 4 and config.options.bound == 2
    args, extra = build_parser().parse_known_args(["run", "ddp"])
    assert config_from_args(args, extra).world_size == 2
