""""This machine" as the planner's cluster: the matmul rate of a step's shapes, the measured
wire used as measured, the fitted step cost (fixed per layer and step, a FLOP rate), ranks
sharing cores, the cache, ``labkit plan --gpu this-machine``; bad input named before anything
runs."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from labkit.base.errors import ConfigError
from labkit.cli import main
from labkit.theory.plan import plan, predict
from labkit.theory.plan_comm import COMM_OPS, CommCost, fit_comm, wire_of
from labkit.theory.plan_lab import LAB_GPT, LAYOUTS, lab_calls, predict_lab
from labkit.theory.plan_local import (
    CostSample,
    StepCost,
    fit_step_cost,
    gemm_rate,
    load_cost,
    measured_cluster,
    step_flops,
    store_cost,
)
from labkit.theory.plan_machine import Calls, rank_cpu
from labkit.theory.plan_models import MODELS, Training, cluster
from labkit.theory.plan_terms import LINK_EFFICIENCY, Layout, allreduce_time

pytestmark = pytest.mark.lesson13


def test_gemm_rate_is_the_flop_weighted_harmonic_mean() -> None:
    """Two shapes of equal FLOPs at 1 and 3 GFLOP/s take 1 + 1/3 time units: 1.5 GFLOP/s."""
    rates = {"10x10x10": 1e9, "20x5x10": 3e9}
    assert gemm_rate(rates, [(10, 10, 10), (20, 5, 10)]) == pytest.approx(1.5e9)


def test_gemm_rate_names_the_shapes_calibrate_lacks() -> None:
    with pytest.raises(ConfigError, match=r"\(7, 7, 7\).*labkit calibrate"):
        gemm_rate({"10x10x10": 1e9}, [(10, 10, 10), (7, 7, 7)])


def test_the_measured_wire_is_used_as_measured() -> None:
    """The planner discounts datasheet bandwidth by LINK_EFFICIENCY; a fitted wire is already
    what a collective reaches, so its all-reduce time is the ring formula on the fit."""
    net = measured_cluster(rate_flops_per_s=1e9, alpha_s=50e-6, bandwidth_Bps=2e9, ranks=4,
                           memory_bytes=16e9)
    t, inter = allreduce_time(1e6, 4, 1, net)
    assert t == pytest.approx(2 * 3 * 50e-6 + 2 * 3 / 4 * 1e6 / 2e9) and inter == 0.0
    assert net.intra.bandwidth_Bps * LINK_EFFICIENCY == pytest.approx(2e9)
    assert net.gpu.memory_bytes == pytest.approx(4e9) and net.per_node == net.gpus == 4


def test_compute_of_one_rank_follows_the_rate_it_is_given() -> None:
    """Halving the rate doubles the compute term, and nothing else of a DP-free step."""
    model, training = MODELS["lab-gpt"], Training(global_batch_tokens=8 * 64,
                                                   precision="fp32", optimizer="momentum")
    lay = Layout(1, 1, 2, 4, 2)
    terms = []
    for rate in (2e9, 1e9):
        net = measured_cluster(rate_flops_per_s=rate, alpha_s=0.0, bandwidth_Bps=1e12, ranks=2,
                               memory_bytes=8e9)
        terms.append({t.name: t.value for t in predict(model, net, training, lay).time})
    assert terms[1]["compute"] == pytest.approx(2 * terms[0]["compute"])
    assert terms[1]["bubble"] == pytest.approx(2 * terms[0]["bubble"])


@pytest.mark.parametrize("field, value", [("rate_flops_per_s", 0.0), ("bandwidth_Bps", -1.0),
                                          ("memory_bytes", 0.0), ("alpha_s", -1e-6)])
def test_bad_measurements_are_named(field: str, value: float) -> None:
    kwargs = {"rate_flops_per_s": 1e9, "alpha_s": 1e-5, "bandwidth_Bps": 1e9, "ranks": 2,
              "memory_bytes": 8e9, field: value}
    with pytest.raises(ConfigError, match=field):
        measured_cluster(**kwargs)


# --- the fitted step cost, shared cores, the lab's layouts ----------------------------------

def _synthetic(step_s: float, layer_s: float, rate: float, strategy: str = "ddp",
               microbatch_s: float = 0.0, ms: tuple[int, ...] = (1,)) -> list[CostSample]:
    """Samples that follow the model exactly."""
    return [CostSample(layers=L, batch=b, strategy=strategy, microbatches=m,
                       seconds=step_s + m * (microbatch_s + layer_s * L)
                       + step_flops(LAB_GPT, L, b) / rate)
            for m in ms for L, b in ((2, 4), (2, 8), (4, 4), (4, 8), (4, 16), (8, 8))]


def _comms(cpu_s: float = 2e-4) -> tuple[CommCost, ...]:
    """Collectives that get slower with more ranks on the machine, as on a shared one."""
    return tuple(CommCost(op=op, ranks=r, wall_s=r * 1e-4, wall_s_per_byte=r * 1e-9,
                          cpu_s=cpu_s, cpu_s_per_byte=1e-9)
                 for op in COMM_OPS for r in (2, 4, 8))


def _cost(step_s: float = 2e-3, layer_s: float = 1e-3, rate: float = 5e9,
          cores: int = 2, comm_cpu_s: float = 2e-4) -> StepCost:
    cost = fit_step_cost(_synthetic(step_s, layer_s, rate), LAB_GPT, cores=cores, alpha_s=1e-4,
                         bandwidth_Bps=1e9, memory_bytes=64e9)
    return replace(cost, comms=_comms(comm_cpu_s))


def test_the_fit_separates_fixed_and_proportional_parts() -> None:
    """Depth moves layers and FLOPs, batch only FLOPs: the three parts come back exactly."""
    cost = _cost(step_s=3e-3, layer_s=0.8e-3, rate=4e9)
    assert cost.step_s == pytest.approx(3e-3) and cost.layer_s == pytest.approx(0.8e-3)
    assert cost.flops_per_s == pytest.approx(4e9) and cost.worst_residual < 1e-9


def test_each_engine_is_fitted_on_its_own_and_microbatches_separate() -> None:
    """Two microbatches move the per-microbatch and per-layer parts but not the step's:
    an engine measured at m = 1 and 2 gets all four back; DDP's fit is the cost's own."""
    samples = (_synthetic(2e-3, 1e-3, 5e9)
               + _synthetic(6e-3, 3e-3, 4e9, "hybrid", microbatch_s=1.5e-3, ms=(1, 2)))
    cost = fit_step_cost(samples, LAB_GPT, cores=2, alpha_s=0.0, bandwidth_Bps=1e9,
                         memory_bytes=8e9)
    hybrid = cost.engine("hybrid")
    assert (hybrid.step_s, hybrid.microbatch_s, hybrid.layer_s, hybrid.flops_per_s) == \
        pytest.approx((6e-3, 1.5e-3, 3e-3, 4e9))
    assert cost.engine("ddp").layer_s == pytest.approx(1e-3) == cost.layer_s
    assert cost.engine("zero") == cost.engine("ddp")  # not measured: DDP's
    assert StepCost.from_json(json.loads(json.dumps(cost.to_json()))) == cost
    with pytest.raises(ConfigError, match="needs DDP's samples"):
        fit_step_cost(samples[6:], LAB_GPT, cores=2, alpha_s=0.0, bandwidth_Bps=1e9,
                      memory_bytes=8e9)


def test_a_part_noise_makes_negative_is_dropped_not_kept() -> None:
    """No fixed cost per layer, measured with noise: the fit keeps layer_s at 0, never < 0."""
    samples = [replace(s, seconds=s.seconds * (1.02 if i % 2 else 0.98))
               for i, s in enumerate(_synthetic(4e-3, 0.0, 2e9))]
    cost = fit_step_cost(samples, LAB_GPT, cores=2, alpha_s=0.0, bandwidth_Bps=1e9,
                         memory_bytes=8e9)
    assert cost.layer_s >= 0 and cost.step_s >= 0 and cost.flops_per_s > 0
    assert cost.worst_residual < 0.1


def test_the_fit_needs_three_sizes() -> None:
    with pytest.raises(ConfigError, match=r"three or more sizes.*\(2, 8\)"):
        fit_step_cost(_synthetic(1e-3, 1e-3, 1e9)[:2], LAB_GPT, cores=2, alpha_s=0.0,
                      bandwidth_Bps=1e9, memory_bytes=8e9)


def test_a_collective_is_fitted_to_two_lines_and_bad_rows_are_named() -> None:
    rows = [(size, 3e-4 + size * 2e-9, 1e-4 + size * 5e-10) for size in (4096, 32768, 262144)]
    fit = fit_comm("all_reduce", 4, rows)
    assert (fit.wall_s, fit.wall_s_per_byte, fit.cpu_s, fit.cpu_s_per_byte) == \
        pytest.approx((3e-4, 2e-9, 1e-4, 5e-10))
    assert fit.wall(1000.0, calls=3) == pytest.approx(3 * 3e-4 + 1000 * 2e-9)
    flat = fit_comm("exchange", 2, [(4096, 2e-4, 1e-4), (262144, 1.9e-4, 1e-4)])
    assert flat.wall_s_per_byte == 0.0 and flat.wall_s == pytest.approx(1.95e-4)
    assert wire_of(fit) == pytest.approx((1.5e-4, 5e8))  # 2 alpha + S / B, a 2-member ring
    with pytest.raises(ConfigError, match=r"op \('gossip'\) must be one of"):
        fit_comm("gossip", 2, rows)
    with pytest.raises(ConfigError, match="two or more sizes"):
        fit_comm("all_reduce", 2, rows[:1])


def test_a_collective_is_priced_at_the_layouts_rank_count() -> None:
    cost = _cost()
    assert cost.comm("all_reduce", 4).ranks == 4 and cost.comm("exchange", 3).ranks == 4
    assert cost.comm("all_reduce", 16).ranks == 8
    with pytest.raises(ConfigError, match="no 'all_reduce' measurement"):
        replace(cost, comms=()).comm("all_reduce", 2)
    pair, eight = (next(t.value for t in predict_lab(LAYOUTS[i], cost).time if t.name == "tp")
                   for i in (2, 0))
    # dp2 x tp2 (4 ranks) and dp2 x pp2 x tp2 (8): 4 all-reduces per layer per microbatch,
    # 16 in both, of 4 sequences (8 ranks) or 8 sequences (4 ranks) of 32 x 64 fp32 values
    assert pair == pytest.approx(16 * (4e-4 + 8 * 32 * 64 * 4 * 4e-9))
    assert eight == pytest.approx(16 * (8e-4 + 4 * 32 * 64 * 4 * 8e-9))


def test_the_lab_engines_collectives_are_counted() -> None:
    """tp: 4 per layer per microbatch; pp: m exchanges; dp: DDP one bucket, the ZeRO
    transform one all-reduce per unit (stage 0) or a reduce-scatter and an all-gather
    (stage 1): 10 units a block, tok and pos on the first stage, ln_f and head on the last."""
    by = {lay.name: lab_calls(lay) for lay in LAYOUTS}
    first, last = by["hybrid dp2 x pp2 x tp2"]
    assert first.ranks == last.ranks == 4
    assert [(c.group, c.op, c.calls) for c in first.calls] == [
        ("tp", "all_reduce", 16), ("pp", "exchange", 2), ("dp", "all_reduce", 22)]
    (ddp,), (zero,) = by["ddp 2"], by["zero-1 2"]
    assert [(c.op, c.calls) for c in ddp.calls] == [("all_reduce", 1)]
    assert [(c.op, c.calls) for c in zero.calls] == [("reduce_scatter", 44), ("all_gather", 44)]
    assert ddp.calls[0].nbytes == pytest.approx(4 * LAB_GPT.params)
    assert [c.nbytes for c in zero.calls] == pytest.approx([4 * LAB_GPT.params] * 2)
    with pytest.raises(ConfigError, match="group of"):
        Calls(group="ep", op="all_reduce", calls=1, nbytes=4, how="")


def test_fixed_work_is_charged_per_layer_per_microbatch_and_not_split_by_tp() -> None:
    """A pipeline stage of 2 layers, 2 microbatches: 4 layer-passes of layer_s, plus step_s;
    tp = 2 halves the FLOPs of its ranks but not their per-op work."""
    cost = _cost(step_s=2e-3, layer_s=1e-3)
    by = {lay.name: {t.name: t.value for t in predict_lab(lay, cost).time} for lay in LAYOUTS}
    assert by["pipeline 2 (1F1B)"]["fixed"] == pytest.approx(2 * 2 * 1e-3 + 2e-3)
    assert by["ddp 2"]["fixed"] == pytest.approx(4 * 1e-3 + 2e-3)
    assert by["hybrid dp2 x tp2"]["fixed"] == pytest.approx(by["ddp 2"]["fixed"])
    assert by["hybrid dp2 x tp2"]["compute"] == pytest.approx(by["ddp 2"]["compute"] / 2)


def test_ranks_that_share_cores_take_every_ranks_cpu_over_the_cores() -> None:
    """8 ranks on 2 cores: the step is at least every rank's compute, fixed work and
    collectives' CPU, added up, over 2 cores; with a core each (8 cores) the cores term is 0.
    The terms add up to the step."""
    lay = LAYOUTS[0]
    assert lay.ranks == 8
    shared, own = predict_lab(lay, _cost(cores=2)), predict_lab(lay, _cost(cores=8))
    term = {t.name: t.value for t in shared.time}
    assert {t.name: t.value for t in own.time}["cores"] == 0.0
    assert term["cores"] > 0 and shared.step_s == pytest.approx(own.step_s + term["cores"])
    assert shared.step_s == pytest.approx(sum(term.values()))
    cost = _cost(cores=2)
    flops = 2 * step_flops(LAB_GPT, LAB_GPT.layers, 8) / cost.flops_per_s
    work = flops + 2 * 2 * 2 * LAB_GPT.layers * cost.layer_s + 8 * cost.step_s
    comm = sum(k.ranks * rank_cpu(cost, 8, k) for k in lab_calls(lay))
    assert comm > 0 and shared.step_s == pytest.approx((work + comm) / 2)
    # each collective's CPU is every rank's: 1 ms more a call, (calls of all ranks) ms more
    dearer = predict_lab(lay, _cost(cores=2, comm_cpu_s=1.2e-3))
    calls = sum(k.ranks * c.calls for k in lab_calls(lay) for c in k.calls)
    assert dearer.step_s - shared.step_s == pytest.approx(calls * 1e-3 / 2)


def test_a_gpu_preset_has_no_fixed_or_cores_term() -> None:
    """The published cases' steps are unchanged: a GPU has no measured fixed cost."""
    q = plan(MODELS["llama3-8b"], cluster("h100-sxm", 8), Training(global_batch_tokens=2**20))[0]
    assert not {"fixed", "cores"} & {t.name for t in q.time}


def test_the_lab_gpt_is_the_lessons_gpt() -> None:
    from labkit.lessons.plan_lesson import lesson_decoder

    assert replace(lesson_decoder(), name=LAB_GPT.name) == LAB_GPT


def test_the_step_cost_is_cached_per_machine(tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LABKIT_CACHE", str(tmp_path))
    assert load_cost(2) is None
    cost = _cost()
    store_cost(cost)
    assert load_cost(2) == cost and load_cost(4) is None
    store_cost(replace(cost, comms=(), cores=3))  # an older entry, without collectives
    assert load_cost(3) is None


def test_cli_this_machine_ranks_the_lab_layouts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    """``labkit plan --gpu this-machine``: the lab's layouts from the cached cost, fastest
    predicted step first; ``--gpus`` keeps those of that many ranks; --json is clean."""
    monkeypatch.setenv("LABKIT_CACHE", str(tmp_path))
    monkeypatch.setattr("labkit.theory.plan_cli.cpu_count", lambda: 2)
    store_cost(_cost(cores=2))
    assert main(["plan", "--gpu", "this-machine", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["layouts"]
    assert sorted(r["name"] for r in rows) == sorted(lay.name for lay in LAYOUTS)
    steps = [r["step_s"] for r in rows]
    assert steps == sorted(steps)
    assert main(["plan", "--gpu", "this-machine", "--gpus", "4"]) == 0
    text = capsys.readouterr().out
    assert "hybrid dp2 x tp2" in text and "ddp 2" not in text and "Terms of #1" in text
    assert main(["plan", "--gpu", "this-machine", "--model", "llama3-8b"]) == 2
    assert "--model ('llama3-8b') does not apply" in capsys.readouterr().err
    assert main(["plan", "--gpu", "this-machine", "--gpus", "3"]) == 2
    assert "ranks (3) must be one of" in capsys.readouterr().err


def test_the_lab_runs_match_their_layouts(tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Each layout runs on as many ranks as the planner counts; a cached cost is reused
    without measuring again, and ``refresh`` measures."""
    from labkit.lessons import plan_local as lab

    for lay in LAYOUTS:
        kwargs = lab.run_kwargs(lay, 3)
        assert kwargs["world_size"] == lay.ranks and kwargs["strategy"] == lay.strategy
        if lay.strategy == "hybrid":
            assert (kwargs["options"]["dp"], kwargs["options"]["pp"],
                    kwargs["options"]["tp"]) == (lay.dp, lay.pp, lay.tp)
    monkeypatch.setenv("LABKIT_CACHE", str(tmp_path))
    monkeypatch.setattr(lab, "cpu_count", lambda: 2)
    cost, fresh = _cost(cores=2), _cost(cores=2, step_s=5e-3)
    store_cost(cost)
    monkeypatch.setattr(lab, "measure", lambda steps, rounds: fresh)
    assert lab.step_cost() == cost
    assert lab.step_cost(refresh=True) == fresh and load_cost(2) == fresh
