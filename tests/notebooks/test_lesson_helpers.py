"""The lessons' own arithmetic, without processes: the numbers and sentences a lesson prints
beside its runs, computed from hand-made timelines and rows.

Pinned here: predictions across a link never fall below the step measured inside a node (no
negative link cost); contention is named where communication took many times what its wire
needs; lesson 11's gradient rate counts only the window in which every worker computed; the
sentences say when a run contradicts the rule, and why; Ray's reports are summed up.
"""

from __future__ import annotations

import warnings
from types import SimpleNamespace

import pytest

from labkit.analysis.timeline import Timeline
from labkit.base.events import Event, Lane, Op
from labkit.lessons import async_ps, cluster_predict, cluster_text, dp_lesson, machine, ray_lesson
from labkit.theory.interconnect import Interconnect

LOOP = Interconnect("loopback", 150e-6, 1.4e9, "intra-node")
SLOW = Interconnect("25g", 30e-6, 6.25e6, "inter-node")


def test_a_slower_wire_only_adds_time() -> None:
    """What the link adds beyond loopback is its latency and the difference of the transfer
    times; a link faster than loopback adds no bandwidth cost, never a negative one."""
    extra = cluster_predict.extra_link(SLOW, LOOP)
    assert extra.alpha_s == SLOW.alpha_s
    assert 1 / extra.bandwidth_Bps == pytest.approx(1 / SLOW.bandwidth_Bps - 1 / LOOP.bandwidth_Bps)
    fast = Interconnect("fast", 0.0, 10e9, "inter-node")
    assert cluster_predict.extra_link(fast, LOOP).bandwidth_Bps == cluster_predict.FREE_BPS
    for link in (SLOW, fast):
        for size in (0, 4096, 32768, 1e6):
            assert cluster_predict.allreduce_s(size, 2, cluster_predict.extra_link(link, LOOP)) >= 0


def test_tp_across_the_link_is_never_predicted_below_tp_inside() -> None:
    """Lesson 10: the TP prediction is the in-node step plus TP's communication priced on the
    link beyond loopback; for 4 blocks of 32 KB activations over 25 GbE that is 16
    all-reduces of about 5.3 ms, added, never subtracted."""
    from labkit.lessons.cluster_comm import _comm_cost, placement_configs

    tp_cfg, pp_cfg = placement_configs("ethernet_25g")
    extra = cluster_predict.extra_link(SLOW, LOOP)
    tp_added, pp_added = _comm_cost(tp_cfg, extra), _comm_cost(pp_cfg, extra)
    per_allreduce = 2 * SLOW.alpha_s + 32768 * (1 / SLOW.bandwidth_Bps - 1 / LOOP.bandwidth_Bps)
    assert tp_added == pytest.approx(16 * per_allreduce)
    assert tp_added > pp_added > 0


def test_contention_is_named_only_far_beyond_the_wire() -> None:
    """Communication 3x (or more) what the wire needs is waiting for a core; less is not."""
    assert cluster_predict.contention(0.031, 0.004) == pytest.approx(7.75)
    assert cluster_predict.contention(0.010, 0.004) is None
    assert cluster_predict.contention(0.010, 0.0) is None


def _ps_run(arrivals: dict[int, list[int]], pull_at: int = 0) -> SimpleNamespace:
    """A ps run whose server received each worker's gradients at the given ns."""
    events = [Event(0, Lane.COMM, Op.RECV, t - 10, 10, step=i, peer=w, name="push")
              for w, ts in arrivals.items() for i, t in enumerate(ts)]
    events += [Event(w, Lane.COMM, Op.RECV, pull_at, 5, step=0, peer=0, name="pull")
               for w in arrivals]
    return SimpleNamespace(timeline=Timeline(events, 3),
                           config=SimpleNamespace(options=SimpleNamespace(servers=1)))


def test_gradient_rate_counts_while_every_worker_computes() -> None:
    """Under ASP the fast worker (1 gradient per 10 ms) finishes at 100 ms; the straggler
    (1 per 40 ms) goes on alone. The rate counts the 10 + 2 gradients in by 100 ms, not the
    whole run's, which would end at the straggler's pace."""
    ms = 1_000_000
    asp = _ps_run({1: [10 * ms * (i + 1) for i in range(10)],
                   2: [40 * ms * (i + 1) for i in range(10)]})
    rate = async_ps.gradient_rate(asp)
    assert rate["gradients"] == 12 and rate["window_s"] == pytest.approx(0.1)
    assert rate["rate"] == pytest.approx(120.0)
    exp = async_ps.PSExperiment({"asp, straggler": asp}, 2.1,
                                {"factor": 4.0, "straggler_rank": 2, "world_size": 3})
    assert async_ps.realized_factor(exp) == pytest.approx(4.0)


def _race(bsp_s: float, asp_s: float) -> async_ps.PSExperiment:
    ms = 1_000_000
    pace = {"asp": {1: 10 * ms, 2: 40 * ms}, "bsp": {1: 40 * ms, 2: 40 * ms}}

    def run(c: str, t: float) -> SimpleNamespace:
        ps = _ps_run({w: [gap * (i + 1) for i in range(10)] for w, gap in pace[c].items()})
        return SimpleNamespace(
            metrics={"updates": 40, "updates_per_s": 10.0, "mean_staleness": 0.0,
                     "max_staleness": 0, "consistency": c, "workers": 2,
                     "loss_vs_time": [[t / 2, 2.3]] * 12 + [[t, 2.0]] * 12,
                     "max_abs_diff_vs_reference": 1e-8},
            losses=[2.0] * 8, timeline=ps.timeline, config=ps.config)
    runs = {"bsp, straggler": run("bsp", bsp_s), "asp, straggler": run("asp", asp_s)}
    return async_ps.PSExperiment(runs, 2.1, {"world_size": 3, "bound": 2, "factor": 4.0},
                                 machine.Load(3.0, 2))


def test_the_race_sentence_follows_the_run() -> None:
    """ASP first by 2x: the race's verdict holds, with the ratio it judged, and so does the
    gradient rate (120 / 50 per second). BSP and ASP within the noise of one run each: the
    race is inconclusive, never "holds", and the sentence says how many ranks shared how many
    cores and how busy it was, and why ASP's ratio has no replay (its arrival order)."""
    from labkit.lessons.async_ps_verdicts import RACE, RATE

    text = async_ps.race_text(_race(2.0, 1.0))
    assert f"{RACE}: BSP's time to the target / ASP's 2.00 +- 0.20, the rule wants above " \
           "1.00 -- holds" in text
    assert f"{RATE} (the formula: ((W-1)F+1)/W = 2.50x): ASP / BSP gradients per second " \
           "2.40 +- 0.24" in text and text.count("-- holds") == 2
    text = async_ps.race_text(_race(0.73, 0.75))
    # 0.02 s apart where the curves are read every 0.37 s: together, not "BSP first"
    assert "reached loss 2.1 together, within one gradient's interval (0.38 s" in text, text
    assert "-- holds" in text  # the rate only
    assert "BSP's time to the target / ASP's 0.97 +- 0.10, the rule wants above 1.00 -- " \
           "inconclusive on this machine" in text
    assert "3 ranks shared 2 cores" in text and "load average 3.0 on 2 cores" in text
    assert "no dedicated-core replay of this ratio" in text


def test_a_lead_shorter_than_the_curves_resolution_is_not_called_first() -> None:
    """Lesson 11's equal workers printed "BSP reached loss 2.1 first (BSP 0.35 s, ASP 0.36 s,
    SSP 0.36 s)": curves read once a gradient cannot order times closer than that. A lead of
    several gradients' intervals still names who was first."""
    def falling(to_2_at_s: float) -> list[list[float]]:  # a point every 0.03 s
        return [[i * 0.03, 2.3 - 0.3 * i * 0.03 / to_2_at_s] for i in range(40)]

    exp = _race(2.0, 1.0)
    exp.runs["bsp, straggler"].metrics["loss_vs_time"] = falling(0.45)  # 2.1 at 0.39 s
    exp.runs["asp, straggler"].metrics["loss_vs_time"] = falling(0.36)  # 2.1 at 0.42 s
    text = async_ps.race_text(exp)
    assert "with the straggler: reached loss 2.1 together, within one gradient's interval " \
        "(0.03 s; BSP 0.39 s, ASP 0.42 s)" in text, text
    exp.runs["bsp, straggler"].metrics["loss_vs_time"] = falling(0.35)  # 2.1 at 0.33 s
    exp.runs["asp, straggler"].metrics["loss_vs_time"] = falling(0.6)  # 2.1 at 0.57 s
    assert "with the straggler: BSP reached loss 2.1 first" in async_ps.race_text(exp)


def test_sharing_cores_silences_only_the_oversubscription_warning() -> None:
    """Inside ``sharing_cores`` the launcher's 'ranks share cores' warning is left out (the
    lesson says it in words); every other warning still shows."""
    from labkit.launchers.jobs import warn_oversubscribed

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        with machine.sharing_cores():
            warn_oversubscribed(10_000, "gloo", stacklevel=1)
            warnings.warn("something else", UserWarning, stacklevel=1)
    assert [str(w.message) for w in seen] == ["something else"]


def test_placement_sentence_checks_the_rule() -> None:
    """TP slowed more than the pipeline: the rule holds; the other way round: contradicted,
    with why; a slowdown below 1 is named as noise and counted; a contended in-node
    measurement is named."""
    def rows(tp: float, pp: float) -> dict:
        return {"rows": [
            {"strategy": "tp", "where": "inside one node", "link_bytes_per_step": 5.24e5,
             "contention": 6.5, "exposed_s": 0.033, "wire_comm_s": 0.005},
            {"strategy": "tp", "where": "across ethernet_25g", "slowdown": tp,
             "predicted_slowdown": 3.0},
            {"strategy": "pipeline", "where": "inside one node", "link_bytes_per_step": 1.31e5,
             "contention": None, "step_s": 0.027},
            {"strategy": "pipeline", "where": "across ethernet_25g", "slowdown": pp,
             "predicted_slowdown": 2.0, "step_s": 0.027 * pp, "predicted_step_s": 0.054}]}
    text = cluster_text.placement_text(rows(3.1, 1.6))
    assert "TP sends 4.0x the pipeline's bytes" in text and text.endswith("-- holds")
    assert "tp's communication took 33.0 ms per step where the wire needs 5.0 ms" in text
    assert "contradicted by this run" in cluster_text.placement_text(rows(1.2, 1.6))
    # the issue's run: "the rule holds here" beside a pipeline step 0.803x as long across a
    # slower wire. That 0.80 is noise of at least 20 %, named and counted in the verdict.
    odd = cluster_text.placement_text(rows(1.1, 0.803))
    assert "the pipeline's step got 0.80x as long across a slower wire, which no wire does" in odd
    assert "-- holds" not in odd and "inconclusive on this machine" in odd
    assert "the run added 1.6 ms -- its messages travelled while other microbatches computed" \
        in cluster_text.placement_text(rows(3.1, 1.06))


@pytest.fixture
def quiet(monkeypatch: pytest.MonkeyPatch) -> None:
    """The machine as the verdicts read it: no other program busy
    (``dp_verdicts.judged_load``)."""
    monkeypatch.setattr(machine, "load_now", lambda fresh=False: machine.Load(0.5, 2, 0.0))


def test_weak_scaling_sentences_split_what_left_the_model(quiet: None) -> None:
    """Within 1.5x over the run's steps the model holds; far above it, the compute and
    communication per step are given beside what the wire needs, and ranks beyond the cores
    are named; the issue's 27.8 ms against a predicted 248.5 ms is contradicted."""
    def run(step_ms: float, compute_ms: float, comm_ms: float, ranks: int) -> SimpleNamespace:
        ev = []
        for r in range(ranks):
            for s in range(4):
                t0 = s * 10**9
                ev += [Event(r, Lane.STEP, Op.STEP, t0, int(step_ms * 1e6), step=s),
                       Event(r, Lane.COMPUTE, Op.FORWARD, t0, int(compute_ms * 1e6), step=s),
                       Event(r, Lane.COMM, Op.ALL_REDUCE, t0 + int(compute_ms * 1e6),
                             int(comm_ms * 1e6), step=s)]
        return SimpleNamespace(timeline=Timeline(ev, ranks), step_time_s=step_ms / 1e3,
                               metrics={})

    runs = {1: run(4.0, 4.0, 0.0, 1), 2: run(6.0, 4.0, 2.0, 2), 64: run(120.0, 9.0, 100.0, 64)}
    text = dp_lesson.scaling_text(runs, {1: 0.004, 2: 0.005, 64: 0.006})
    assert "2-rank step (ms; median of its steps) 6.0 +- 0.0, the rule wants from 3.3 to " \
        "7.5 -- holds" in text
    assert "64 ranks: measured 120.0 ms, predicted 6.0 ms; compute 9.0 ms per rank (2.2x" in text
    assert "64 ranks on" in text and "take turns" in text
    assert "64-rank step (ms; median of its steps) 120.0 +- 0.0, the rule wants from 4.0 to " \
        "9.0 -- inconclusive on this machine (64 ranks took turns on" in text  # never flips
    issue = dp_lesson.scaling_text({1: runs[1], 2: run(27.8, 20.0, 5.0, 2)}, {1: 0.004, 2: 0.2485})
    assert "contradicted by this run" in issue and "the prediction is above the run" in issue
    # below its prediction the step's own parts are given, not a cause nothing measured
    assert "2 ranks: measured 27.8 ms, predicted 248.5 ms: the prediction is above the run; " \
        "compute 20.0 ms per rank (5.0x one rank's), exposed communication" in issue
    assert "waited for a core" not in issue
    assert "the 1-rank step it starts from computed 4.0 ms" in issue  # the prediction's base


def test_weak_scaling_gives_every_size_the_threads_of_a_rank(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Every world size runs on the threads a rank has when the most ranks that fit share the
    cores (2 cores, sizes 1, 2, 4: one thread each, the lone rank too); a size already run
    is reused, and threads given by the caller win."""
    import labkit.api

    asked: list[tuple[int, int]] = []

    def fake_run(world_size: int, threads_per_rank: int, **_: object) -> str:
        asked.append((world_size, threads_per_rank))
        return f"run {world_size}"

    monkeypatch.setattr(labkit.api, "run", fake_run)
    monkeypatch.setattr(dp_lesson, "cpu_count", lambda: 2)
    monkeypatch.setattr("labkit.base.devices.cpu_count", lambda: 2)
    out = dp_lesson.weak_scaling({2: "reused"}, strategy="ddp-naive")
    assert out == {1: "run 1", 2: "reused", 4: "run 4"} and asked == [(1, 1), (4, 1)]
    asked.clear()
    dp_lesson.weak_scaling(sizes=(1, 2), threads_per_rank=2)
    assert asked == [(1, 2), (2, 2)]
    monkeypatch.setattr(dp_lesson, "cpu_count", lambda: 8)
    monkeypatch.setattr("labkit.base.devices.cpu_count", lambda: 8)
    asked.clear()
    dp_lesson.weak_scaling(sizes=(1, 2, 4))
    assert asked == [(1, 2), (2, 2), (4, 2)]  # 4 ranks on 8 cores: 2 threads each


def test_the_calls_account_names_slow_calls_whatever_their_size(quiet: None) -> None:
    """A 2-rank step whose all-reduces include slow small ones (as quiet runs here showed:
    a 40 B call taking 3 ms where the fit says 0.3): the account sums the calls against the
    fit for their bytes, names the slow calls and their sizes, and replaces the sentence
    that blamed compute sharing cores (naive DDP's calls run after backward, with nothing
    computing) with it."""
    from labkit.theory import AlphaBeta

    fit = AlphaBeta(alpha_s=3e-4, bandwidth_Bps=1e9)
    calls = [(3.0, 40), (0.4, 2048), (0.6, 2**20), (4.0, 2048)]  # ms, bytes

    def run(ranks: int, with_calls: bool) -> SimpleNamespace:
        ev = []
        for r in range(ranks):
            for s in range(3):
                t = s * 10**9
                ev += [Event(r, Lane.STEP, Op.STEP, t, 30 * 10**6, step=s),
                       Event(r, Lane.COMPUTE, Op.FORWARD, t, 5 * 10**6, step=s)]
                t += 5 * 10**6
                for ms, size in (calls if with_calls else []):
                    ev.append(Event(r, Lane.COMM, Op.ALL_REDUCE, t, int(ms * 1e6), step=s,
                                    bytes=size))
                    t += int(ms * 1e6)
        return SimpleNamespace(timeline=Timeline(ev, ranks), step_time_s=0.030, metrics={})

    text = dp_lesson.calls_text(run(2, True), fit)
    want = sum(fit.predict(b, 2) for _, b in calls) * 1e3
    assert f"its 4 all-reduces a step took 8.0 ms against {want:.1f} ms" in text, text
    assert "4 of the 8 calls in 2 steps took 3.0-4.0 ms, more than 3x theirs, at 40 B to " \
        "2.05 KB" in text, text
    assert "Even the median call took 5.0x" in text, text  # the typical call is slow too
    calm = [(0.35, 40), (0.4, 2048), (0.6, 2**20), (4.0, 2048)]
    calls[:] = calm  # a typical call near its prediction: only the slow one differs
    text = dp_lesson.calls_text(run(2, True), fit)
    assert "2 of the 8 calls in 2 steps took 4.0-4.0 ms, more than 3x theirs, all at 2.05 KB" \
        in text, text
    assert "The fit took each size's median call, which leaves such calls out" in text, text
    assert "they are all of the excess and more" in text, text  # the other calls ran under
    fast = [(0.1, 40), (0.1, 2048), (0.2, 2**20), (2.5, 2048)]  # one slow, yet under the fit in sum
    calls[:] = fast
    text = dp_lesson.calls_text(run(2, True), fit)
    assert "the other calls ran under the fit and made up for them" in text, text
    assert "excess" not in text, text  # lesson 01 printed "100% of the excess" of a 0.1 ms one
    calls[:] = calm
    stalled = AlphaBeta(alpha_s=3e-4, bandwidth_Bps=1e9, stall_s=5e-4)  # the bench's mean call
    text = dp_lesson.calls_text(run(2, True), stalled)
    want = sum(stalled.predict(b, 2) + 5e-4 for _, b in calm) * 1e3
    assert f"against {want:.1f} ms that section 2's fit predicts for their bytes and its mean " \
        f"stall (0.50 ms a call)" in text, text  # each call charged the stall too
    assert "its stall term the benchmark's calls on average: these calls stalled longer" in text
    calls[:] = [(3.0, 40), (0.4, 2048), (0.6, 2**20), (4.0, 2048)]  # the typical call slow too
    text = dp_lesson.calls_text(run(2, True), stalled)
    assert text.endswith("ran slower than the benchmark's back-to-back calls, its average "
                         "stall included."), text
    calls[:] = calm
    assert dp_lesson.calls_text(run(2, False), fit) == ""
    said = dp_lesson.scaling_text({1: run(1, False), 2: run(2, True)}, {1: 0.005, 2: 0.008}, fit)
    assert "contradicted by this run" in said and "its 4 all-reduces a step" in said
    assert "gloo's threads share" not in said


def test_ray_reports_are_summed_up_in_one_sentence() -> None:
    """Two deaths and a retry become one line; nothing reported says so."""
    lines = ["A worker died or was killed while executing a task by an unexpected system "
             "error. To troubleshoot ...", "A worker died or was killed ...",
             "Task flaky_task failed. There are 2 retries remaining, so the task will be retried."]
    text = ray_lesson.reports_text(lines)
    assert "3 line(s)" in text and "2 about a process that died" in text
    assert "1 about a task being retried" in text
    assert "nothing" in ray_lesson.reports_text([])


def test_ray_resources_become_a_sentence_not_a_raw_dict() -> None:
    """Issue 33: lesson 12's first output was ``ray.cluster_resources()`` as a raw dict; it is
    now a sentence with the CPUs, the memory, the object store and how many tasks run at once."""
    text = ray_lesson.resources_text({"CPU": 2.0, "memory": 16.9e9, "object_store_memory": 7.2e9,
                                      "node:127.0.0.1": 1.0, "node:__internal_head__": 1.0})
    assert text.startswith("Ray is up: 1 node") and "2 CPUs and no GPU" in text
    assert "16.9 GB of memory" in text and "object store of 7.2 GB" in text
    assert "at most 2 run at once" in text and "{" not in text
    assert "8 CPUs and 1 GPU to" in ray_lesson.resources_text({"CPU": 8.0, "GPU": 1.0, "node:a": 1.0})


def test_the_price_sentence_reads_the_loss_figures_last_point() -> None:
    """The issue's lesson 11: "ASP ended 0.255 higher in loss than BSP" beside a figure where
    both curves ended at 1.28 -- the sentence read the mean of the last eighth of the
    updates, the figure the last 12 gradients. Both now read ``loss_curve``'s last point."""
    from labkit.visuals.ps import loss_curve

    exp = _race(2.0, 1.0)
    for res in exp.runs.values():
        res.losses = [2.5] * 8  # per update: not what the curve (per gradient, smoothed) ends at
    for name, row in ((r["run"], r) for r in exp.table()):
        assert row["final_loss"] == loss_curve(exp.runs[name].metrics)[1][-1]
    assert "final loss BSP 2.0000, ASP 2.0000" in async_ps.price_text(exp)


def test_a_final_loss_gap_inside_the_curves_own_movement_is_not_called_a_price() -> None:
    """Lesson 11 printed "ASP ended 0.001 higher in loss than BSP" (1.2839 against 1.2834)
    under a markdown cell that calls a higher ASP loss the rule: a gap smaller than BSP's own
    curve moved over its last point says the final loss does not show the price; a real gap
    still says how much higher."""
    from labkit.visuals.ps import loss_curve

    exp = _race(2.0, 1.0)
    bsp, asp = (exp.runs[n].metrics for n in ("bsp, straggler", "asp, straggler"))
    bsp["loss_vs_time"] = [[i * 0.1, 2.4 - 0.02 * i] for i in range(24)]
    last = loss_curve(bsp)[1]
    moved = abs(last[-1] - last[-2])
    asp["loss_vs_time"] = [[i * 0.1, last[-1] + moved / 2] for i in range(24)]
    text = async_ps.price_text(exp)
    assert "the final loss does not show the price here" in text and "higher" not in text, text
    asp["loss_vs_time"] = [[i * 0.1, last[-1] + 0.3] for i in range(24)]
    assert "ASP ended 0.300 higher in loss than BSP" in async_ps.price_text(exp)


def _contended(cpu_ms: float, wall_ms: float, steps: int = 3, idle: str | None = None) -> SimpleNamespace:
    """Two ranks, each step compute (``cpu_ms`` of CPU in ``wall_ms`` of wall time: the rest
    waited for a core) then a blocking all-reduce of 1 ms; ``idle``: rank 1 then sleeps in a
    span of that name for ``wall_ms`` (a straggler's idle, no CPU time)."""
    ms, events, t = 1_000_000, [], 0
    wall = int(wall_ms * ms)
    for s in range(steps):
        end = t + wall * (2 if idle else 1) + ms  # the all-reduce ends together on both ranks
        for r in (0, 1):
            events.append(Event(r, Lane.COMPUTE, Op.FORWARD, t, wall, step=s,
                                cpu_ns=int(cpu_ms * ms)))
            arrive = t + wall
            if idle and r == 1:
                events.append(Event(r, Lane.COMPUTE, Op.BACKWARD, arrive, wall, step=s,
                                    name=idle, cpu_ns=0))
                arrive += wall
            events.append(Event(r, Lane.COMM, Op.ALL_REDUCE, arrive, end - arrive, step=s,
                                bytes=4096))
            events.append(Event(r, Lane.STEP, Op.STEP, t, end - t, step=s))
        t = end
    timeline = Timeline(events, 2)
    return SimpleNamespace(timeline=timeline, step_time_s=timeline.median_step_s())


def test_a_replayed_run_drops_the_wait_for_a_core_and_keeps_an_asked_idle() -> None:
    """Compute that used 2 ms of CPU in 8 ms of wall time replays at 2 ms: a step of 3 ms
    (with the 1 ms all-reduce), a quarter of the 9 ms measured; the stand-in keeps the run's
    other attributes. A straggler's idle ("slow x4", a sleep) is kept at 3 x its own CPU time,
    not dropped as waiting."""
    from labkit.lessons import replayed

    run = _contended(2.0, 8.0)
    run.config = "kept"
    copy = replayed.replayed(run)
    assert copy is not None and copy.config == "kept"
    assert copy.step_time_s == pytest.approx(0.003, rel=0.01)
    assert replayed.delay(run) == pytest.approx(3.0, rel=0.01)
    slow = _contended(2.0, 8.0, idle="slow x4")
    idle = [e for e in replayed.intended_idle(slow.timeline) if e.name == "slow x4"]
    assert {e.cpu_ns for e in idle} == {6_000_000}
    assert replayed.replayed(slow).step_time_s == pytest.approx(0.009, rel=0.01)  # 2 + 6 + 1


def test_the_replayed_sentence_reads_the_verdicts_own_quantity() -> None:
    """``again`` applies the lesson's own reading to the replayed runs, labelled as a model,
    beside the measured value; a run without CPU times has no replay, and says so; the most
    delayed run is the one whose replay is drawn."""
    from labkit.analysis.replay import MODEL_LABEL
    from labkit.lessons import replayed

    a, b = _contended(2.0, 8.0), _contended(4.0, 4.0)
    text = replayed.again("a's step / b's", lambda x, y: x.step_time_s / y.step_time_s,
                          [a, b], measured=9 / 5)
    assert text == f"a's step / b's, {MODEL_LABEL}: 0.60, where this machine measured 1.80"
    bare = SimpleNamespace(timeline=Timeline([Event(0, Lane.COMPUTE, Op.FORWARD, 0, 5)], 1))
    assert "no dedicated-core replay" in replayed.again("x", lambda r: 1.0, [bare], 1.0)
    assert replayed.most_delayed({"a": a, "b": b, "bare": bare}) == "a"


def test_the_faq_ordering_is_a_verdict_with_its_noise() -> None:
    """Lesson 10's "more of the step lost across nodes": 30 % across vs 10 % inside holds;
    11 % vs 10 % is within two runs' noise (inconclusive), and the sentence never says holds."""
    def over(inside: float, across: float) -> dict:
        return {"inside": inside, "across": across, "link": "infiniband_hdr",
                "faq_inside": (0.05, 0.15), "faq_across": (0.15, 0.30), "measured": True}

    assert cluster_text.overhead_text(over(0.10, 0.30)).endswith("-- holds")
    near = cluster_text.overhead_text(over(0.10, 0.11))
    assert "exposed share across / inside 1.10 +- 0.11" in near and "holds" not in near
    assert "inconclusive on this machine" in near


def test_ray_tasks_are_judged_against_their_waves(monkeypatch: pytest.MonkeyPatch) -> None:
    """Four 0.2 s tasks on 2 CPUs: 0.41 s is two waves (holds); 0.8 s is not, and the lesson
    says why and that a sleeping task has nothing to replay, never "run the cell again"."""
    monkeypatch.setattr(ray_lesson, "cpu_count", lambda: 2)
    results = [{"pid": 10 + i % 2} for i in range(4)]
    assert ray_lesson.tasks_text(0.41, results).endswith("-- holds")
    slow = ray_lesson.tasks_text(0.8, results)
    assert "seconds to the last task's end 0.80 +- 0.04, the rule wants from 0.27 to 0.60 -- " \
           "contradicted by this run" in slow
    assert "no dedicated-core replay" in slow and "again" not in slow


def test_hierarchical_is_judged_on_the_side_the_model_puts_it() -> None:
    """4 MB across the link: the model says hierarchical is faster (1.5x); measured 1.4x
    holds. At a size where the model says no faster, a measured 1.3x contradicts it, and the
    lesson says why and that the benchmark's times cannot be replayed."""
    def rows(pred_flat: float, flat: float) -> dict:
        return {"rows": [{"impl": "ring", "bytes": 4e6, "time_s": flat, "predicted_s": pred_flat},
                         {"impl": "hierarchical", "bytes": 4e6, "time_s": 1.0,
                          "predicted_s": 1.0}]}

    assert cluster_text.hierarchical_text(rows(1.5, 1.4)).endswith("(predicted 1.50x): flat / "
                                                                    "hierarchical time 1.40 +- "
                                                                    "0.14, the rule wants above "
                                                                    "1.00 -- holds")
    odd = cluster_text.hierarchical_text(rows(0.9, 1.3))
    assert "is no faster than the flat ring" in odd and "contradicted by this run" in odd
    assert "no dedicated-core replay" in odd


def test_compression_across_the_link_is_a_verdict_per_method() -> None:
    """PowerSGD 3x faster than plain DDP across the link holds; fp16 at 1.02x is inside two
    runs' noise: inconclusive, never "holds", and the why is said (no runs: no replay)."""
    def row(method: str, loop: float, link: float | None) -> dict:
        return {"method": method, "wire_bytes": 1e5, "speedup_loopback": loop,
                "speedup_link": link}

    comp = {"rows": [row("none", 1.0, 1.0), row("fp16", 0.9, 1.02), row("powersgd", 0.8, 3.0)]}
    text = cluster_text.compression_text(comp)
    assert "on loopback, faster than plain DDP: none of them" in text
    assert "powersgd pays for itself across the slow link: plain DDP's step / this method's " \
           "3.00 +- 0.30, the rule wants above 1.00 -- holds" in text
    assert "fp16 pays for itself across the slow link: plain DDP's step / this method's 1.02 " \
           "+- 0.10, the rule wants above 1.00 -- inconclusive on this machine" in text
    assert "the largest speedup across the link: powersgd 3.0x" in text
