"""labkit.launchers.cluster without processes: link specs and presets, the config rules, names, tc
arguments, which rank a failed run blames, the run locks, and the no-cluster fallback."""

from __future__ import annotations

import argparse
import json
import subprocess
from pathlib import Path

import pytest

from labkit.base.errors import ConfigError
from labkit.config import links
from labkit.config.links import PRESETS, SCALE, parse_link
from labkit.config.run import RunConfig
from labkit.launchers.cluster import leftovers as lo
from labkit.launchers.cluster import netns as ns
from labkit.launchers.cluster.failures import pick_failure, timeout_failure
from labkit.lessons.cluster_predict import flat_vs_hierarchical
from labkit.theory.interconnect import INTERCONNECTS, Interconnect

pytestmark = pytest.mark.lesson10


def test_every_interconnect_has_a_preset_slowed_down_by_scale() -> None:
    """Preset = the real link with bandwidth / SCALE and latency x SCALE (ratios preserved)."""
    assert set(PRESETS) == set(INTERCONNECTS)
    for name, spec in PRESETS.items():
        real = INTERCONNECTS[name]
        assert spec.rate_bps == pytest.approx(real.bandwidth_Bps * 8 / SCALE)
        assert spec.latency_s == pytest.approx(real.alpha_s * SCALE)
        assert spec.real is real and spec.preset == name
    assert PRESETS["ethernet_100g"].rate_bps == pytest.approx(200e6)
    assert PRESETS["nvlink4"].rate_bps / PRESETS["infiniband_hdr"].rate_bps == pytest.approx(18)


@pytest.mark.parametrize("text, rate, latency", [
    ("200mbit", 200e6, 0.0), ("200Mbit,1ms", 200e6, 1e-3), ("1.5gbit", 1.5e9, 0.0),
    ("500kbit,300us", None, None), (" 2gbit , 0.5s ", 2e9, 0.5), ("infiniband_hdr", 400e6, 2.5e-3),
])
def test_link_specs_parse_to_rate_and_latency(text: str, rate: float | None,
                                              latency: float | None) -> None:
    """RATE[,LATENCY] in tc's decimal units, or a preset name; 500 kbit is below the floor."""
    if rate is None:
        with pytest.raises(ConfigError, match="must be between 1 Mbit/s and 10 Gbit/s"):
            parse_link(text)
        return
    spec = parse_link(text)
    assert (spec.rate_bps, spec.latency_s) == (pytest.approx(rate), pytest.approx(latency))


@pytest.mark.parametrize("text, fragment", [
    ("fast", "link rate 'fast' in 'fast' must be a number with a unit bit, kbit, mbit or gbit"),
    ("200mb", "link rate '200mb'"),
    ("200mbit,5", "link latency '5' in '200mbit,5' must be a number with a unit us, ms or s"),
    ("20gbit", "must be between 1 Mbit/s and 10 Gbit/s"),
    ("200mbit,2s", "link latency '2s' must be at most 1 s"),
    ("", "must be a preset name or RATE[,LATENCY]"),
])
def test_bad_link_specs_name_the_value_and_an_example(text: str, fragment: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_link(text)
    assert fragment in str(err.value)
    assert "e.g." in str(err.value)


def test_config_rules_name_every_problem(monkeypatch: pytest.MonkeyPatch) -> None:
    """nodes must divide world_size, link needs nodes > 1, nccl cannot cross the emulated
    link, and a machine without emulated nodes says why: all in one ConfigError."""
    monkeypatch.setenv("LABKIT_CLUSTER_MODE", "off")
    with pytest.raises(ConfigError) as err:
        RunConfig(strategy="ddp", world_size=3, nodes=2, backend="nccl", link="fast")
    text = str(err.value)
    assert "world_size (3) must be a multiple of nodes (2)" in text
    assert "link rate 'fast'" in text
    assert "backend 'nccl' cannot run on emulated nodes" in text
    assert "nodes (2) > 1 needs emulated nodes, which are not available here" in text
    assert "LABKIT_CLUSTER_MODE=off" in text
    with pytest.raises(ConfigError, match=r"link \('200mbit'\) needs nodes > 1"):
        RunConfig(strategy="ddp", link="200mbit")
    with pytest.raises(ConfigError, match=r"nodes \(0\) must be an integer from 1 to 16"):
        RunConfig(strategy="ddp", nodes=0)


def test_emulated_nodes_resolve_to_gloo(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("labkit.config.cluster.config_problems", lambda config: [])
    cfg = RunConfig(strategy="ddp", world_size=2, nodes=2, link="200mbit")
    assert cfg.resolved_backend() == "gloo"
    assert cfg.to_json()["nodes"] == 2 and cfg.to_json()["link"] == "200mbit"


def test_cli_flags_build_the_fields_and_the_worker_refuses_them(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``labkit run --nodes 2 --link X`` sets RunConfig.nodes / link; under torchrun they
    are an error (torchrun's --nnodes says how many nodes there are)."""
    from labkit.config.flags import add_run_flags, config_from_args
    from labkit.launchers.torchrun import TorchrunEnv, torchrun_config

    monkeypatch.setattr("labkit.config.cluster.config_problems", lambda config: [])
    parser = argparse.ArgumentParser()
    add_run_flags(parser)
    args, extra = parser.parse_known_args(["ddp", "--nodes", "2", "--link", "200mbit,1ms"])
    cfg = config_from_args(args, extra)
    assert (cfg.nodes, cfg.link) == (2, "200mbit,1ms")
    env = TorchrunEnv(rank=0, world_size=2, local_rank=0, local_world_size=1, node_rank=0)
    with pytest.raises(ConfigError, match="are for `labkit run`"):
        torchrun_config(args, extra, env, False)


def test_names_carry_the_prefix_and_run_id_and_fit_interface_limits() -> None:
    """Linux interface names are at most 15 characters; namespaces are labkit-<id>-..."""
    names = ns.Names("ab12c")
    devs = [names.node_dev(k) for k in range(16)] + [names.switch_dev(15), names.bridge]
    assert all(d.startswith("labkitab12c") and len(d) <= 15 for d in devs)
    assert names.node_ns(3) == "labkit-ab12c-n3" and names.switch_ns == "labkit-ab12c-sw"
    assert ns.address(0) == "10.77.0.1" and ns.address(1) == "10.77.0.2"


def test_tc_arguments_hold_the_rate_a_bucket_and_a_queue() -> None:
    args = ns.tbf_args(200e6)
    assert args[:3] == ["tbf", "rate", "200000000bit"]
    burst, limit = int(args[4]), int(args[6])
    assert burst >= 4 * ns.MTU and limit >= 2 * burst
    assert limit >= 200e6 / 8 * ns.TBF_QUEUE_S  # the queue holds TBF_QUEUE_S at the rate
    assert ns.netem_args(2.5e-3)[:3] == ["netem", "delay", "2500us"]


@pytest.mark.parametrize("netem", [True, False])
def test_shaping_puts_rate_on_both_ends_and_latency_on_the_uplink(
        netem: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """With netem: netem delay at the root of the node's cable, tbf under it (the netem
    docs' recipe), tbf on the switch end. Without netem (no sch_netem): tbf alone, and
    shape() says the latency was not applied."""
    calls: list[list[str]] = []

    def fake(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        calls.append(list(argv))
        unknown = not netem and "netem" in argv
        return subprocess.CompletedProcess(list(argv), 2 if unknown else 0, "",
                                           "Error: Specified qdisc kind is unknown." if unknown
                                           else "")

    monkeypatch.setattr(ns, "run_cmd", fake)
    topo = ns.Topology("ab12c", 2)
    assert topo.shape(parse_link("200mbit,2ms")) is netem
    node0 = [c for c in calls if c[2] == "labkit-ab12c-n0"]
    switch = [c for c in calls if c[2] == "labkit-ab12c-sw"]
    if netem:
        first = node0[0]
        assert first[first.index("root"):first.index("root") + 4] == ["root", "handle", "1:",
                                                                       "netem"]
        assert first[first.index("delay") + 1] == "2000us"
        assert node0[1][node0[1].index("parent") + 1] == "1:1" and "tbf" in node0[1]
    else:
        assert "netem" in node0[0] and node0[-1][node0[-1].index("root") + 1] == "tbf"
        assert "Specified qdisc kind is unknown" in (topo.latency_error or "")
        node1 = [c for c in calls if c[2] == "labkit-ab12c-n1"]
        assert not any("netem" in c for c in node1)  # decided once, for every cable
    assert all(c[c.index("root") + 1] == "tbf" for c in switch)
    assert len(switch) == 2  # one downlink per node


def test_a_failed_tbf_under_netem_falls_back_to_rate_only_everywhere(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """If netem loads but the tbf cannot sit under it (on node 1, say), every cable ends
    with the same rate-only shaping, and the reason is kept."""
    calls: list[list[str]] = []

    def fake(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        calls.append(list(argv))
        bad = "parent" in argv and argv[2] == "labkit-ab12c-n1"
        return subprocess.CompletedProcess(list(argv), 2 if bad else 0, "", "boom" if bad else "")

    monkeypatch.setattr(ns, "run_cmd", fake)
    topo = ns.Topology("ab12c", 2)
    assert topo.shape(parse_link("200mbit,2ms")) is False
    assert "boom" in (topo.latency_error or "")
    for node in ("labkit-ab12c-n0", "labkit-ab12c-n1"):
        last = [c for c in calls if c[2] == node][-1]
        assert last[last.index("root") + 1] == "tbf", (node, last)


def _reads(rate: float, seconds: float, stalls: dict[float, float]) -> list[tuple[float, int, bool]]:
    """A receiver's reads of a stream arriving at ``rate`` bytes/s for ``seconds``: one small
    read per millisecond, except that at each time in ``stalls`` it waits that long for a core
    and then reads what piled up (in full buffers, then a short one that drains the socket)."""
    from labkit.launchers.cluster.probe import CHUNK

    times = sorted({next((at + w for at, w in stalls.items() if at <= ms / 1e3 < at + w), ms / 1e3)
                    for ms in range(1, round(seconds * 1e3) + 1)})
    marks, got = [], 0
    for t in times:
        arrived = int(rate * min(t, seconds))
        while arrived - got >= CHUNK:
            got += CHUNK
            marks.append((t, got, False))
        if arrived > got:
            got = arrived
            marks.append((t, got, True))
    return marks


@pytest.mark.parametrize("stalls", [{}, {0.48: 0.08}, {0.09: 0.06}, {0.09: 0.06, 0.48: 0.08}],
                         ids=["none", "at-the-end", "at-the-start", "both"])
def test_the_probe_rate_ignores_a_receiver_that_waited_for_a_core(stalls: dict[float, float]
                                                                   ) -> None:
    """A receiver waiting 60-80 ms for a core at either end of the probe's half-second window
    moved the rate 10-15 % before (CI read a shaped link 10 % off beside a loaded worker); the rate
    between reads that drained the socket, while data still followed, is the link's."""
    from labkit.launchers.cluster.probe import goodput

    rate = 50e6  # InfiniBand HDR / SCALE, in bytes/s
    marks = _reads(rate, 0.5, stalls)
    got = goodput(marks)
    assert got["goodput_Bps"] == pytest.approx(rate, rel=0.01), got
    assert got["drained_reads"] > 100
    t_end, b_end, _ = marks[-1]
    t0, b0, _ = next(m for m in marks if m[1] >= 0.2 * b_end)
    old = (b_end - b0) / (t_end - t0)
    if len(stalls) == 1:  # the old rule (first read past 20 %, last read) charged the wait to
        # the link (two waits, one at each end, happen to cancel in it)
        assert abs(old / rate - 1) > 0.1, old
    assert goodput([])["goodput_Bps"] == 0.0


def test_a_real_exception_is_blamed_before_deaths_and_echoes() -> None:
    """Rank 1 raised; rank 0 saw the connection close; torchrun saw rank 1 exit 1."""
    def error(rank: int, message: str, tb: str) -> str:
        return json.dumps({"error": {"rank": rank, "kind": "exception", "message": message,
                                     "traceback": tb}})

    echo = error(0, "RuntimeError: Connection closed by peer", "")
    real = error(1, "RuntimeError: injected fault", "tb")
    agent = "Root Cause (first observed failure):\n  rank      : 1 (local_rank: 0)\n  exitcode  : 1 (pid: 9)"
    failure, others = pick_failure({0: echo, 1: "noise\n" + real}, [agent], 1)
    assert (failure.rank, failure.kind, failure.traceback) == (1, "exception", "tb")
    assert [f.rank for f in others] == [0]


def test_a_silent_death_is_read_from_the_agent_summary() -> None:
    agent = "[0]:\n  rank      : 3 (local_rank: 1)\n  exitcode  : -9 (pid: 77)\n"
    failure, _ = pick_failure({3: "last words"}, ["", agent], 1)
    assert (failure.rank, failure.kind) == (3, "signal")
    assert "SIGKILL" in failure.message and "last words" in failure.traceback
    failure, _ = pick_failure({}, ["boom"], 1)
    assert failure.rank is None and "no rank reported an error" in failure.message


def test_a_timeout_names_the_rank_outside_communication() -> None:
    err = timeout_failure(20.0, {0: "stack 0", 1: "stack 1"}, {0: (2, 1), 1: (2, 0)})
    assert err.rank == 1 and "rank 1 stopped making progress at step 2" in str(err)
    assert "--- rank 0 (step 2) ---" in err.failure.traceback
    assert timeout_failure(20.0, {}, {}).rank is None


def test_run_locks_tell_live_runs_from_dead_ones(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """A run's lock is held while it lives; a sweep removes only the lock nobody holds."""
    monkeypatch.setattr(lo, "lock_dir", lambda: tmp_path)
    live = lo.new_run()
    assert lo.is_alive(live.path)
    dead = tmp_path / "fffff.lock"
    dead.write_text("")
    assert not lo.is_alive(dead)
    report = lo.sweep()
    assert "fffff" in report.locks and live.run_id not in report.locks
    assert live.path.exists() and not dead.exists()
    live.release()
    assert not live.path.exists() and not lo.is_alive(live.path)


def test_flat_ring_crosses_the_link_with_more_bytes_than_hierarchical() -> None:
    link = Interconnect("x", 0.0, 1e6, "inter-node")
    pred = flat_vs_hierarchical(1e6, nodes=2, ranks_per_node=2, link=link)
    assert pred["flat_s"] == pytest.approx(1.5) and pred["hierarchical_s"] == pytest.approx(1.0)


def test_without_a_cluster_the_lesson_shows_predictions(monkeypatch: pytest.MonkeyPatch) -> None:
    """No namespaces here: rows keep the preset's prediction, say why, and still plot."""
    from labkit.doctor import cluster_status
    from labkit.lessons import cluster as ex
    from labkit.lessons import cluster_comm as cx
    from labkit.visuals import cluster as vc

    monkeypatch.setenv("LABKIT_CLUSTER_MODE", "off")
    rows = ex.measure_links(("ethernet_25g",))
    assert rows[0]["measured_bps"] is None and "not measured" in rows[0]["note"]
    hier = cx.hierarchical_vs_flat("ethernet_100g", sizes=("4MB",))
    assert [r["time_s"] for r in hier["rows"]] == [None, None]
    assert hier["rows"][0]["predicted_s"] == pytest.approx(1.5 * 4e6 / 25e6 + 6 * 5e-3)
    vc.plot_link_check(rows)
    vc.plot_hierarchical(hier)
    status = cluster_status()
    assert status["available"] is False and "off" in status["reason"]
    assert links.format_rate(2.5e9) == "2.5 Gbit/s"


def test_the_link_sentence_says_how_close_or_why_a_link_fell_off(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Within ``RATE_TOLERANCE`` the sentence gives the worst link; a link further off is named
    with its numbers and the load read after its probe: busy, the probe waited for a core (in
    the words the notebook checks look for); quiet, the shaper itself missed."""
    from labkit.lessons import cluster_text as say
    from labkit.lessons.machine import NOT_DEDICATED, Load

    def row(link: str, err: float, load: Load | None = None) -> dict[str, object]:
        r: dict[str, object] = {"link": link, "rate_bps": 400e6, "measured_bps": 400e6 * (1 + err),
                                "rate_error": err}
        return r if load is None else {**r, "load": load}

    text = say.link_text([row("infiniband_hdr", -0.007), row("ethernet_25g", -0.02)])
    assert text == "every link delivered its shaped rate within 2.0% (worst: ethernet_25g)"
    busy = say.link_text([row("infiniband_hdr", -0.007), row("ethernet_25g", -0.12,
                                                             Load(3.1, 2, others=1.4))])
    assert "every link" not in busy
    assert "ethernet_25g delivered 352.0 Mbit/s, -12.0% off its shaped 400.0 Mbit/s" in busy
    assert "other programs used 1.4 of 2 cores" in busy and NOT_DEDICATED in busy
    quiet = say.link_text([row("ethernet_25g", +0.08, Load(0.2, 2, others=0.01))])
    assert "+8.0% off" in quiet and "on a quiet machine" in quiet and NOT_DEDICATED not in quiet
    monkeypatch.setattr(say, "load_now", lambda fresh=False: Load(0.2, 2, others=0.0))
    assert "on a quiet machine" in say.link_text([row("ethernet_25g", -0.3)])  # no load kept
