"""How much GPU memory training needs, and what ZeRO sharding takes off each GPU.

Teaches: model states (parameters, gradients, optimizer state) cost a fixed number of bytes
per parameter; data parallelism keeps a full copy on every rank, and ZeRO (Rajbhandari et
al. 2020, "ZeRO: Memory Optimizations Toward Training Trillion Parameter Models") removes
that redundancy in three stages. Activations are the other big term; for transformers we
follow Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer
Models"). Units: bytes throughout; GB means 1e9 bytes (GiB = 2**30 is said explicitly).

The paper's headline check, reproduced by the tests: a 7.5e9-parameter model with mixed-
precision Adam (K = 12) on 64 data-parallel GPUs needs 120 GB per GPU without ZeRO,
31.4 GB with stage 1, 16.6 GB with stage 2 and 1.9 GB with stage 3. Seed 003's "a 7B
model needs about 126 GB" is 18 B/param (fp32 gradients plus 16-bit and fp32 weights, a
common mixed-precision accounting) or, read another way, 7e9 x 16 B = 112 GB of model
states plus ~14 GB of activations and workspace. ``zero_memory`` counts model states
only; ``fits`` adds the activations (``labkit.theory.activations``, Korthikanti et al.)
when it is given the model's shape, or an activation estimate of your own.
"""

from __future__ import annotations

from dataclasses import dataclass

from labkit.base.errors import ConfigError
from labkit.theory.activations import RECOMPUTE, TransformerShape, model_activation_bytes
from labkit.theory.batch import check_choice, check_int, check_number

GB = 1e9
PRECISIONS = ("mixed", "fp32")
OPTIMIZERS = ("adam", "momentum", "sgd")
MEMORY_TERMS = ("params", "grads", "optimizer", "activations")

# Optimizer-state bytes per parameter (K in the ZeRO paper). Under mixed precision the
# optimizer also owns the fp32 master copy of the weights (4 B), as the paper counts it.
_OPTIMIZER_BYTES = {
    "mixed": {"adam": 4 + 4 + 4, "momentum": 4 + 4, "sgd": 4},
    "fp32": {"adam": 4 + 4, "momentum": 4, "sgd": 0},
}


def _check_stage(stage: object) -> int:
    if not isinstance(stage, bool):
        for allowed in (0, 1, 2, 3):
            if stage == allowed:
                return allowed
    raise ConfigError(f"stage ({stage!r}) must be 0, 1, 2 or 3 (ZeRO stages); e.g. stage=2")


def bytes_per_param(precision: str = "mixed", optimizer: str = "adam", *,
                    fp32_grads: bool = False) -> dict[str, int]:
    """Bytes of model state per parameter, split into ``params``, ``grads``, ``optimizer``.

    ``precision="mixed"`` (bf16 or fp16 training): 2 B working weights + 2 B gradients +
    optimizer state that includes the 4 B fp32 master weights: Adam 4 + 4 (m) + 4 (v) = 12,
    momentum SGD 4 + 4 = 8, plain SGD 4. ``precision="fp32"``: 4 B weights + 4 B gradients
    + Adam 8 (m, v), momentum 4, SGD 0. So Adam costs the famous 16 bytes/param either
    way: mixed precision saves activation memory and bandwidth, not model-state memory.
    ``fp32_grads=True`` (mixed only) keeps the gradients in fp32 (4 B, as many frameworks
    accumulate them): 2 + 4 + 12 = 18 B/param. That is seed 003's "7B needs about 126 GB"
    (7e9 x 18 B; its own 16 B rule gives 112 GB) and what DeepSpeed's memory estimators
    count. Returns ints; ``total`` is the sum.
    """
    check_choice("precision", precision, PRECISIONS, "precision='mixed'")
    check_choice("optimizer", optimizer, OPTIMIZERS, "optimizer='adam'")
    if fp32_grads and precision != "mixed":
        raise ConfigError("fp32_grads=True only applies to precision='mixed' (fp32 training "
                          "has fp32 gradients already); e.g. bytes_per_param('mixed', "
                          "fp32_grads=True)")
    weight = 2 if precision == "mixed" else 4
    result = {"params": weight, "grads": 4 if fp32_grads else weight,
              "optimizer": _OPTIMIZER_BYTES[precision][optimizer]}
    result["total"] = sum(result.values())
    return result


def zero_memory(params: float, dp: int, stage: int, precision: str = "mixed",
                optimizer: str = "adam", *, offload_optimizer: bool = False,
                offload_params: bool = False) -> dict[str, float]:
    """Model-state bytes held by EACH data-parallel rank under ZeRO ``stage``.

    ``params`` is the parameter count (Psi), ``dp`` the data-parallel degree (N_d).
    Stage 0 (plain DDP) shards nothing; stage 1 divides the optimizer state by ``dp``;
    stage 2 also the gradients; stage 3 also the parameters. Activations are not included.
    Keys: ``params``, ``grads``, ``optimizer``, ``total`` (bytes on the GPU; divide by 1e9
    for GB).

    Offloading (DeepSpeed's ``offload_optimizer`` / ``offload_param``; ZeRO-Offload, Ren et
    al. 2021): ``offload_optimizer`` keeps this rank's optimizer state (fp32 master, m, v)
    in CPU memory and runs the update there; ``offload_params`` (ZeRO-3 only) keeps the
    parameter shard there too, fetched layer by layer. Offloaded terms are 0 on the GPU
    and appear, with their sum, under ``cpu``; ``zero_offload_traffic`` says what each step
    then moves over PCIe.
    """
    psi = check_number("params", params, "params=7.5e9", allow_equal=False)
    dp = check_int("dp", dp, 1, "dp=64")
    stage = _check_stage(stage)
    if offload_params and stage != 3:
        raise ConfigError(f"offload_params needs stage 3 (got stage {stage}): only ZeRO-3 "
                          "shards the parameters it could move; e.g. stage=3, "
                          "offload_params=True")
    per = bytes_per_param(precision, optimizer)
    sharded = {"optimizer": stage >= 1, "grads": stage >= 2, "params": stage >= 3}
    result = {k: psi * per[k] / (dp if sharded[k] else 1)
              for k in ("params", "grads", "optimizer")}
    moved = [k for k, on in (("optimizer", offload_optimizer), ("params", offload_params)) if on]
    if moved:
        result["cpu"] = sum(result[k] for k in moved)
        for k in moved:
            result[k] = 0.0
    result["total"] = sum(result[k] for k in ("params", "grads", "optimizer"))
    return result


def zero_offload_traffic(params: float, dp: int, precision: str = "mixed") -> float:
    """Bytes each rank moves over PCIe per step with ``offload_optimizer``.

    Its gradient shard goes to the CPU for the update and the updated 16-bit parameter
    shard comes back: ``2 x element bytes x params / dp`` (ZeRO-Offload's 2 x 2 Psi / N_d
    under mixed precision). Divide by the link's bandwidth (``get_link("pcie4")``) for
    the time it adds when it does not overlap.
    """
    psi = check_number("params", params, "params=7.5e9", allow_equal=False)
    dp = check_int("dp", dp, 1, "dp=8")
    check_choice("precision", precision, PRECISIONS, "precision='mixed'")
    element = 2 if precision == "mixed" else 4
    return 2 * element * psi / dp


def zero_comm_volume(params: float, stage: int, precision: str = "mixed",
                     dp: int | None = None) -> dict[str, float]:
    """Bytes each rank sends per training step for gradient/parameter sync under ZeRO.

    Follows the ZeRO paper's section 7: plain DDP all-reduces the gradients, and a ring
    all-reduce is a reduce-scatter (Psi elements) followed by an all-gather (Psi elements),
    2 Psi in all. Stages 1 and 2 do exactly that (reduce-scatter gradients, all-gather the
    updated parameters), so they cost 1x DDP. Stage 3 must also all-gather parameters
    before the forward and again before the backward: 3 Psi, i.e. 1.5x DDP.
    Elements are 2 B (``precision="mixed"``) or 4 B (``"fp32"``). With ``dp=None`` the
    paper's large-N volume is returned; with ``dp`` given, the exact ring factor
    (dp-1)/dp is applied to every collective.
    Keys: ``reduce_scatter``, ``all_gather``, ``total`` (bytes) and ``relative_to_ddp``.
    """
    psi = check_number("params", params, "params=7.5e9", allow_equal=False)
    stage = _check_stage(stage)
    check_choice("precision", precision, PRECISIONS, "precision='mixed'")
    ring = 1.0 if dp is None else (check_int("dp", dp, 1, "dp=64") - 1) / dp
    element = psi * (2 if precision == "mixed" else 4) * ring
    gathers = 2 if stage == 3 else 1
    result = {"reduce_scatter": element, "all_gather": gathers * element}
    result["total"] = result["reduce_scatter"] + result["all_gather"]
    result["relative_to_ddp"] = (1 + gathers) / 2
    return result


@dataclass
class FitReport:
    """Whether one training configuration fits in GPU memory, and what dominates it."""

    fits: bool
    per_gpu_bytes: dict[str, float]  # params, grads, optimizer, activations, total
    capacity_bytes: float
    binding: str  # the largest of params / grads / optimizer / activations
    explanation: str  # one readable sentence
    dp: int = 1  # data-parallel degree gpus // (tp * pp)
    activations_counted: bool = True  # False: neither a shape nor activation_gb was given


def fits(params: float, *, gpus: int, gpu_gb: float, stage: int = 0,
         precision: str = "mixed", optimizer: str = "adam", tp: int = 1, pp: int = 1,
         activation_gb: float | None = None, shape: TransformerShape | None = None,
         recompute: str = "none", sequence_parallel: bool = False) -> FitReport:
    """Check whether ``params`` parameters train on ``gpus`` GPUs of ``gpu_gb`` GB each.

    Tensor (``tp``) and pipeline (``pp``) parallelism split the parameters evenly over
    tp*pp GPUs; the remaining factor ``dp = gpus // (tp*pp)`` is data parallel, where ZeRO
    ``stage`` shards model states. Activations (which ZeRO does not shard) come from
    ``shape`` (a ``TransformerShape``: Korthikanti et al. 2022 per layer, split by ``tp``,
    with ``sequence_parallel`` and ``recompute`` = "none" / "selective" / "full"; see
    ``labkit.theory.activations``) or from ``activation_gb``, the activation memory per GPU
    (GB, 1e9 B) you estimate or measure; with neither they are 0 and the explanation says
    they were not counted. Capacity is ``gpu_gb * 1e9`` bytes: marketing
    "24 GB" cards hold 24 GiB (about 25.8e9 B), so this errs slightly on the safe side,
    and the framework's own workspace is not modelled. Seed example: 3e9 params, mixed
    Adam, 4 x 24 GB: stage 0 needs 48 GB per GPU (no), stage 2 16.5 GB, stage 3 12 GB.
    """
    check_number("params", params, "params=3e9", allow_equal=False)
    gpus = check_int("gpus", gpus, 1, "gpus=4")
    capacity = check_number("gpu_gb", gpu_gb, "gpu_gb=24", allow_equal=False) * GB
    tp = check_int("tp", tp, 1, "tp=2")
    pp = check_int("pp", pp, 1, "pp=2")
    check_choice("recompute", recompute, RECOMPUTE, "recompute='full'")
    if shape is not None and activation_gb is not None:
        raise ConfigError(f"give shape ({shape}) or activation_gb ({activation_gb}), not both: "
                          f"the shape computes the activations; e.g. fits(3e9, gpus=4, "
                          f"gpu_gb=24, shape=TransformerShape(layers=36, hidden=2560, heads=32))")

    def activations_at(level: str) -> float:
        if shape is None:
            return 0.0 if activation_gb is None else check_number(
                "activation_gb", activation_gb, "activation_gb=4.0") * GB
        return model_activation_bytes(shape, tp=tp, sequence_parallel=sequence_parallel,
                                      recompute=level)

    activations = activations_at(recompute)
    if gpus % (tp * pp) != 0:
        raise ConfigError(
            f"gpus ({gpus}) must be divisible by tp*pp ({tp}*{pp} = {tp * pp}); "
            f"e.g. gpus={tp * pp * max(1, gpus // (tp * pp))}, tp={tp}, pp={pp}")
    dp = gpus // (tp * pp)
    states = zero_memory(params / (tp * pp), dp, stage, precision, optimizer)
    per_gpu = {k: states[k] for k in ("params", "grads", "optimizer")}
    per_gpu["activations"] = activations
    per_gpu["total"] = sum(per_gpu.values())
    binding = max(MEMORY_TERMS, key=lambda k: per_gpu[k])
    ok = per_gpu["total"] <= capacity
    # GB for GPU-sized numbers; a scaled-down model in the unit that shows its digits
    unit, size = next(((u, b) for u, b in (("GB", GB), ("MB", 1e6), ("kB", 1e3))
                       if max(capacity, per_gpu["total"]) >= b), ("B", 1.0))
    terms = ", ".join(f"{k} {per_gpu[k] / size:.1f}" for k in MEMORY_TERMS)
    layout = f"tp={tp} x pp={pp} x dp={dp}, ZeRO-{stage}, {precision} {optimizer}"
    hint = ""
    if not ok:
        # Point at the first higher ZeRO stage whose model states + activations fit.
        for better in range(stage + 1, 4):
            need = zero_memory(params / (tp * pp), dp, better, precision, optimizer)["total"]
            if need + activations <= capacity:
                hint = f"; ZeRO-{better} would need {(need + activations) / size:.1f} {unit}"
                break
        # With the shape known: the first recomputation level that fits at this stage.
        for level in RECOMPUTE[RECOMPUTE.index(recompute) + 1:] if shape is not None else ():
            need = states["total"] + activations_at(level)
            if need <= capacity:
                hint += f"; {level} activation recomputation would need {need / size:.1f} {unit}"
                break
    counted = shape is not None or activation_gb is not None
    if not counted:
        hint += " (activations not counted: give shape= or activation_gb=)"
    explanation = (
        f"{'Fits' if ok else 'Does not fit'}: {params:.3g} params on {gpus} GPU(s) "
        f"({layout}) need {per_gpu['total'] / size:.1f} {unit} per GPU of "
        f"{capacity / size:.1f} {unit} ({terms} {unit}); the largest term is {binding}{hint}.")
    return FitReport(fits=ok, per_gpu_bytes=per_gpu, capacity_bytes=capacity,
                     binding=binding, explanation=explanation, dp=dp,
                     activations_counted=counted)
