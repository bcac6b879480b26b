"""Verdicts on the devices themselves: GPU memory against ZeRO, matmul peaks against the
datasheet, CUDA-event timing, and the link topology. Pure, like ``judge``: the rows are
tested on recorded, GPU-like numbers (fixtures) on machines without a GPU.
"""

from __future__ import annotations

from labkit.selftest import judge
from labkit.selftest.datasheet import Datasheet
from labkit.selftest.rows import FAIL, PASS, Row
from labkit.selftest.topology import GpuTopology, tp_placement

MiB = 2**20


def gpu_memory(stage: int, precision: str, peak_delta: int, model_states: float,
               phases: dict[str, float]) -> Row:
    """``torch.cuda.max_memory_allocated`` during a ZeRO run (minus what was allocated before
    it) vs the prediction: the paper's model states plus the largest of what each phase of
    the run adds on top (``phases``: e.g. forward/backward = labkit's transient buffers +
    saved activations + the batch + one weight gradient; the end of the run = the whole fp32
    model gathered for its hash). What is left over is the allocator's, named in the row."""
    phase = max(phases, key=lambda k: phases[k])
    predicted = model_states + phases[phase]
    over = peak_delta - predicted
    rel, absolute = judge.GPU_MEM_SLACK
    problems = []
    if peak_delta < model_states * (1 - judge.ZERO_TOL):
        problems.append("the GPU held less than the model states themselves: the shards are "
                        "not where the accounting says")
    elif over > rel * predicted + absolute:
        problems.append(f"{over / MiB:.0f} MiB above the prediction: more than the allocator's "
                        f"rounding and autograd's temporaries explain")
    elif over < -rel * predicted - absolute:
        problems.append(f"{-over / MiB:.0f} MiB below the prediction: a phase the prediction "
                        f"counts did not allocate what it should")
    return Row(key=judge.zero_key(stage, precision, "gpu_memory"), lesson="05",
               check=f"ZeRO-{stage} max_memory_allocated vs prediction ({precision})",
               backend="nccl", status=FAIL if problems else PASS,
               measured=f"{peak_delta / MiB:.0f} MiB peak",
               expected=f"{predicted / MiB:.0f} MiB (states {model_states / MiB:.0f} + {phase} "
                        f"{phases[phase] / MiB:.0f}) +- {rel:.0%} + {absolute // MiB} MiB",
               off_by=f"{over / MiB:+.0f} MiB ({over / predicted:+.1%})",
               note="; ".join(problems) or f"peak set by the {phase}; " + _leftover(over, predicted),
               values={"peak_delta": peak_delta, "predicted": predicted, "model_states":
                       model_states, "phases": phases, "peak_phase": phase, "overhead": over})


def _leftover(over: float, predicted: float) -> str:
    """What a passing memory row says of the bytes the prediction did not name."""
    if abs(over) <= 0.05 * predicted:
        return (f"{over / MiB:+.0f} MiB is the caching allocator's 512-byte rounding and "
                f"autograd's small temporaries")
    return (f"{over / MiB:+.0f} MiB ({over / predicted:+.0%}) is more than rounding: a buffer the "
            f"prediction does not name (inside the slack, so it passes)")


def datasheet_peak(dtype: str, device_name: str, measured: float, sheet: Datasheet | None
                   ) -> Row:
    check = f"{dtype} matmul peak vs the datasheet"
    if sheet is None:
        return Row(key=f"datasheet_{dtype}", lesson="09", check=check, backend="cuda",
                   status=PASS, measured=f"{measured / 1e12:.1f} TFLOP/s",
                   expected="no datasheet entry", note=f"{device_name!r} is not in "
                   f"labkit.selftest.datasheet: the measured peak is shown alone",
                   values={"measured": measured})
    promised = sheet.fp32_flops if dtype == "fp32" else sheet.bf16_flops
    ratio = measured / promised
    lo, hi = judge.DATASHEET_RANGE
    problems = []
    if ratio > hi:
        problems.append("above the datasheet: TF32 was on for an fp32 matmul "
                        "(torch.backends.cuda.matmul.allow_tf32) or the GPU is misnamed"
                        if dtype == "fp32" else "above the datasheet: the GPU is misnamed")
    elif ratio < lo:
        problems.append("far below the datasheet: clocks or power capped, a busy GPU or a MIG "
                        "slice (nvidia-smi -q -d CLOCK,POWER)")
    return Row(key=f"datasheet_{dtype}", lesson="09", check=check, backend="cuda",
               status=FAIL if problems else PASS, measured=f"{measured / 1e12:.1f} TFLOP/s",
               expected=f"{lo:.0%}-{hi:.0%} of {promised / 1e12:g} ({sheet.model}, dense)",
               off_by=f"{ratio:.0%} of the datasheet", note="; ".join(problems) or sheet.source,
               values={"measured": measured, "datasheet": promised, "ratio": ratio,
                       "model": sheet.model})


def gpt_mfu(mfu: float | None, flops_per_step: float, weights: int, layers: int, hidden: int,
            seq: int, samples: int, peak: float | None, peak_source: str,
            note: str | None = None) -> Row:
    """A GPT's MFU on one GPU in bf16: its FLOPs must be PaLM's count (appendix B: 6 N +
    12 L h s per token, N the matmul weights), and its MFU inside ``judge.MFU_RANGE`` of the
    bf16 peak measured on the same GPU."""
    tokens = samples * seq
    paper = 6 * weights * tokens + 12 * layers * hidden * seq * tokens
    problems = []
    if abs(flops_per_step - paper) > judge.FLOPS_TOL * paper:
        problems.append(f"model FLOPs {flops_per_step:.4g} per step, PaLM's (6 N + 12 L h s) x "
                        f"tokens = {paper:.4g}")
    lo, hi = judge.MFU_RANGE
    if mfu is None or not peak:
        problems.append(note or "no bf16 peak: `labkit calibrate --device cuda --dtype bf16` "
                        "failed")
    elif mfu > hi:
        problems.append("MFU above 1: the bf16 peak was measured too low")
    elif mfu < lo:
        problems.append(f"MFU below {lo}: the GPT waits on something other than its matmuls "
                        f"(data on the host, small kernels, a busy GPU)")
    return Row(key="gpt_mfu_bf16", lesson="09", check="MFU of a 1-rank GPT (bf16) vs the "
               "measured bf16 peak", backend="cuda", status=FAIL if problems else PASS,
               measured="-" if mfu is None else f"MFU {mfu:.2f}",
               expected=f"{lo}-{hi} of the peak" + ("" if not peak else
                                                    f", {peak / 1e12:.0f} TFLOP/s ({peak_source})"),
               off_by="" if mfu is None or not peak else
               f"model work {mfu * peak / 1e12:.0f} TFLOP/s",
               note="; ".join(problems) or f"GPT h={hidden}, L={layers}, s={seq}, {samples} "
               f"samples a step; FLOPs = PaLM's count",
               values={"mfu": mfu, "peak_flops_per_s": peak, "flops_per_step": flops_per_step,
                       "paper_flops_per_step": paper})


def cuda_event_timing(event_s: float, host_s: float) -> Row:
    diff = event_s / host_s - 1
    ok = abs(diff) <= judge.EVENTS_TOL
    return Row(key="cuda_events", lesson="00", check="CUDA-event timing vs the host clock",
               backend="cuda", status=PASS if ok else FAIL,
               measured=f"{event_s * 1e3:.1f} ms events, {host_s * 1e3:.1f} ms host",
               expected=f"within {judge.EVENTS_TOL:.0%}", off_by=f"{diff:+.1%}",
               note="" if ok else "CUDA events and the host clock disagree about the same "
               "synchronised work: timelines on this GPU would be wrong",
               values={"event_s": event_s, "host_s": host_s})


def gpu_topology(topo: GpuTopology, visible: list[int], visible_count: int) -> Row:
    """Pass when every visible GPU appears in ``nvidia-smi topo -m``; the note says where TP
    belongs (the slowest link inside each TP group of consecutive GPUs)."""
    missing = [g for g in visible if g >= len(topo.gpus)]
    sentences = tp_placement(topo, [g for g in visible if g < len(topo.gpus)])
    kinds = sorted({code for code in topo.links.values()})
    ok = not missing and len(visible) == visible_count
    return Row(key="topology", lesson="04", check="GPU links (nvidia-smi topo -m) and TP placement",
               backend="host", status=PASS if ok else FAIL,
               measured=f"{len(topo.gpus)} GPUs; links {', '.join(kinds) or 'none'}",
               expected=f"the {visible_count} visible GPU(s) listed",
               note="; ".join(sentences) if ok else f"GPUs {missing or visible} visible to "
               f"torch are not in the nvidia-smi matrix",
               values={"gpus": topo.gpus, "links": {f"{a}-{b}": c for (a, b), c in
                                                    topo.links.items()},
                       "tp_placement": sentences})


def cpu_topology(nodes: dict[int, list[int]], usable: list[int], world_size: int) -> Row:
    """A core per rank (else the timing rows measure waiting for a core), and the NUMA nodes
    a TP group of ``world_size`` ranks could stay inside."""
    fits = [n for n, cpus in nodes.items() if len(set(cpus) & set(usable)) >= world_size]
    ok = len(usable) >= world_size
    where = ("one NUMA node: every rank shares one memory, TP can go anywhere" if len(nodes) <= 1
             else f"{len(nodes)} NUMA nodes; a {world_size}-rank TP group fits inside node(s) "
             f"{fits or 'none'} (labkit does not pin ranks: `taskset` the kernel to keep them "
             f"there)")
    return Row(key="cpu_topology", lesson="10", check="CPU cores per rank and NUMA nodes",
               backend="host", status=PASS if ok else FAIL,
               measured=f"{len(usable)} usable cores, {max(len(nodes), 1)} NUMA node(s)",
               expected=f">= {world_size} cores (one per rank)",
               off_by=f"{len(usable) - world_size:+d} cores",
               note=where if ok else f"{world_size} ranks on {len(usable)} core(s): every timing "
               f"row measures waiting for a core",
               values={"numa_nodes": {str(k): v for k, v in nodes.items()}, "usable": usable})

