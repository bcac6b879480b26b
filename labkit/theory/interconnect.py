"""Links between GPUs, and what each parallel strategy asks of them.

Teaches: interconnects differ by orders of magnitude (NVLink inside a node, InfiniBand or
Ethernet between nodes), and strategies differ in how much they send and how often.
Data parallelism all-reduces the gradients once per step (and can hide it behind the
backward pass); tensor parallelism all-reduces activations inside every layer, on the
critical path (Shoeybi et al. 2019, Megatron-LM); pipeline parallelism sends one
activation per microbatch to the next stage, and pays a bubble instead (Huang et al. 2019,
GPipe). Hence the rule of thumb the lab demonstrates: tensor parallel inside a node over
NVLink, pipeline parallel across nodes over InfiniBand.

Bandwidths are per direction, bytes/s; latencies (alpha) are order-of-magnitude guesses
for one message through NCCL over that link: fit your own with ``comm.fit_alpha_beta`` and
``this_machine``. All times in seconds.
"""

from __future__ import annotations

from dataclasses import dataclass

from labkit.base.errors import ConfigError
from labkit.theory.batch import check_choice, check_int, check_number
from labkit.theory.comm import AlphaBeta, alpha_beta_time, ring_allreduce_time

STRATEGIES = ("dp", "tp", "pp")


@dataclass(frozen=True)
class Interconnect:
    """One kind of link, described by the alpha-beta model."""

    name: str
    alpha_s: float  # latency per message, seconds
    bandwidth_Bps: float  # usable bandwidth per direction, bytes per second
    scope: str  # "intra-node" | "inter-node"
    note: str = ""


# Bandwidths are the datasheets' per-direction peaks (what a "GB/s" line on a spec sheet means
# once bidirectional totals are halved); usable rates are lower, and ``this_machine`` fits
# yours. Sources:
# * PCIe 4.0 / 5.0 x16: 16 / 32 GT/s per lane x 16 lanes, 128b/130b encoding = 31.5 / 63 GB/s
#   per direction (PCI-SIG base specifications 4.0 and 5.0); NVIDIA's A100 PCIe and H100 PCIe
#   datasheets round them to "64 GB/s" and "128 GB/s" both directions together; seed 001: 32.
# * NVLink 3 (A100 SXM): 600 GB/s both directions together (NVIDIA A100 datasheet; seed 003's
#   ~600); NVLink 4 (H100 SXM): 900 GB/s (NVIDIA H100 datasheet; seed 001).
# * NVSwitch (DGX/HGX H100): every GPU reaches every other at its full NVLink 4 rate, so one
#   GPU's share is NVLink 4's 450 GB/s per direction; seed 001's 3.6 TB/s is the switch
#   fabric's aggregate over 8 GPUs, not what one all-reduce rank sends.
# * InfiniBand HDR 200 Gb/s = 25 GB/s, NDR 400 Gb/s = 50 GB/s per port and direction
#   (NVIDIA ConnectX-6 / ConnectX-7 datasheets; seeds 001 and 003 quote HDR).
# * Ethernet: 100 / 25 / 10 Gb/s = 12.5 / 3.125 / 1.25 GB/s (seed 001's FAQ quotes 25 GbE,
#   seed 003 "~1 GB/s").
# PCIe 4.0 x16 (31.5 GB/s) and InfiniBand HDR (25 GB/s) really are close: within a node over
# PCIe, a GPU talks about as fast as a node does over one HDR port. Latencies (alpha) are
# orders of magnitude for one NCCL message: a hop through a switch and a NIC costs more than
# one over PCIe or NVLink.
INTERCONNECTS: dict[str, Interconnect] = {
    link.name: link
    for link in (
        Interconnect("pcie4", 3e-6, 31.5e9, "intra-node",
                     "PCIe 4.0 x16: 31.5 GB/s per direction (PCI-SIG; seed 001's 32)"),
        Interconnect("pcie5", 3e-6, 63e9, "intra-node",
                     "PCIe 5.0 x16: 63 GB/s per direction (PCI-SIG; H100 PCIe datasheet's 128 "
                     "GB/s both ways)"),
        Interconnect("nvlink3", 2e-6, 300e9, "intra-node",
                     "A100 NVLink 3: 600 GB/s both directions together (seed 003's ~600)"),
        Interconnect("nvlink4", 2e-6, 450e9, "intra-node",
                     "H100 NVLink 4: 900 GB/s both directions together (seed 001)"),
        Interconnect("nvswitch", 3e-6, 450e9, "intra-node",
                     "H100 NVSwitch node: every GPU pair at full NVLink 4 speed; seed 001's "
                     "3.6 TB/s is the switch's aggregate, not one GPU's share"),
        Interconnect("infiniband_hdr", 5e-6, 25e9, "inter-node",
                     "InfiniBand HDR: 200 Gb/s = 25 GB/s per direction (seeds 001, 003)"),
        Interconnect("infiniband_ndr", 5e-6, 50e9, "inter-node",
                     "InfiniBand NDR: 400 Gb/s = 50 GB/s per direction (ConnectX-7 datasheet)"),
        Interconnect("ethernet_100g", 1e-5, 12.5e9, "inter-node",
                     "100 Gb/s Ethernet (RoCE): 12.5 GB/s per direction"),
        Interconnect("ethernet_25g", 2e-5, 3.125e9, "inter-node",
                     "25 Gb/s Ethernet (seed 001's FAQ): 3.1 GB/s per direction"),
        Interconnect("ethernet_10g", 5e-5, 1.25e9, "inter-node",
                     "10 Gb/s Ethernet over TCP: 1.25 GB/s, seed 003's '~1 GB/s'"),
    )
}


def get_link(name: str) -> Interconnect:
    """The preset called ``name``, or a ConfigError listing the presets."""
    check_choice("link", name, tuple(INTERCONNECTS), "link='nvlink4'")
    return INTERCONNECTS[name]


def this_machine(alpha_beta: AlphaBeta, name: str = "this machine",
                 scope: str = "intra-node") -> Interconnect:
    """Turn a fit from ``comm.fit_alpha_beta`` into an Interconnect next to the presets."""
    check_choice("scope", scope, ("intra-node", "inter-node"), "scope='intra-node'")
    r2 = "" if alpha_beta.r_squared is None else f", R^2 {alpha_beta.r_squared:.3f}"
    return Interconnect(name, alpha_beta.alpha_s, alpha_beta.bandwidth_Bps, scope,
                        f"fitted from all-reduce timings on {alpha_beta.world_size} ranks{r2}")


@dataclass
class StepPrediction:
    """Predicted time of one training step on one rank; ``total = compute + comm + bubble``."""

    compute_s: float  # useful computation
    comm_s: float  # communication left on the critical path (not hidden)
    total_s: float
    efficiency: float  # compute_s / total_s: share of the step spent computing
    bubble_s: float = 0.0  # pipeline fill/drain idle time
    hidden_comm_s: float = 0.0  # communication overlapped with compute (costs nothing)
    formula: str = ""  # the formula used, in words


def predict_step_time(strategy: str, *, params: float | None = None,
                      flops_per_step_per_device: float | None = None,
                      device_flops_per_s: float | None = None,
                      compute_s: float | None = None, world_size: int, link: Interconnect,
                      bytes_per_value: int = 2, overlap: float = 0.0, batch: int = 1,
                      seq: int = 1, hidden: int | None = None, layers: int | None = None,
                      microbatches: int | None = None) -> StepPrediction:
    """Predict one step's compute, communication and idle time for ``strategy``.

    Compute per rank is ``compute_s``, or ``flops_per_step_per_device /
    device_flops_per_s``. ``world_size`` is the size of the group that talks over ``link``;
    ``bytes_per_value`` is 2 for bf16/fp16, 4 for fp32.
      * ``"dp"``: ring all-reduce of ``params * bytes_per_value`` gradient bytes once per
        step; the fraction ``overlap`` of it hides behind backward.
      * ``"tp"`` (Megatron): per transformer layer, 2 all-reduces in forward (after
        attention and after the MLP) and 2 in backward, each of ``batch*seq*hidden``
        values, over the tp group; nothing hidden. Needs ``hidden`` and ``layers``;
        ``batch`` is the batch this tp group processes per step.
      * ``"pp"``: p = ``world_size`` stages, m = ``microbatches``. ``compute_s`` is one
        stage's compute for all m microbatches; per microbatch a stage sends one activation
        forward and one gradient backward, each ``batch*seq*hidden`` values (``batch`` is
        the microbatch size), costing ``alpha + bytes/bandwidth``. GPipe/1F1B timing:
        ``(m + p - 1) * (compute_s/m + 2*t_msg)``. Needs ``hidden`` and ``microbatches``.
    """
    check_choice("strategy", strategy, STRATEGIES, "strategy='dp'")
    n = check_int("world_size", world_size, 1, "world_size=8")
    bpv = check_int("bytes_per_value", bytes_per_value, 1, "bytes_per_value=2")
    if not isinstance(link, Interconnect):
        raise ConfigError(f"link ({link!r}) must be an Interconnect; e.g. "
                          "link=INTERCONNECTS['nvlink4']")
    if compute_s is not None:
        compute = check_number("compute_s", compute_s, "compute_s=0.3")
    elif flops_per_step_per_device is not None and device_flops_per_s is not None:
        compute = (check_number("flops_per_step_per_device", flops_per_step_per_device,
                                "flops_per_step_per_device=1e15")
                   / check_number("device_flops_per_s", device_flops_per_s,
                                  "device_flops_per_s=400e12", allow_equal=False))
    else:
        raise ConfigError("compute_s (None) is required, or both flops_per_step_per_device "
                          "and device_flops_per_s; e.g. compute_s=0.3")

    bubble = hidden_comm = 0.0
    if strategy == "dp":
        if params is None:
            raise ConfigError("params (None) is required for strategy 'dp'; e.g. params=1e9")
        grads = check_number("params", params, "params=1e9") * bpv
        full = ring_allreduce_time(grads, n, link.alpha_s, link.bandwidth_Bps)
        share = check_number("overlap", overlap, "overlap=0.5")
        if share > 1:
            raise ConfigError(f"overlap ({overlap!r}) must be between 0 and 1; e.g. overlap=0.5")
        comm, hidden_comm = (1 - share) * full, share * full
        formula = f"all-reduce {grads:.3g} B of gradients over {link.name}, {share:.0%} hidden"
    else:
        h = _required_int("hidden", hidden, "hidden=4096", strategy)
        rows = check_int("batch", batch, 1, "batch=8") * check_int("seq", seq, 1, "seq=2048")
        message = float(rows * h * bpv)  # bytes of one activation tensor (b, s, h)
        if strategy == "tp":
            n_layers = _required_int("layers", layers, "layers=32", strategy)
            one = ring_allreduce_time(message, n, link.alpha_s, link.bandwidth_Bps)
            comm = 4 * n_layers * one
            formula = (f"4 all-reduces x {n_layers} layers of {message:.3g} B over "
                       f"{link.name}, none hidden")
        else:
            m = _required_int("microbatches", microbatches, "microbatches=8", strategy)
            t_msg = alpha_beta_time(1, message, link.alpha_s, link.bandwidth_Bps) if n > 1 else 0.0
            slot = compute / m + 2 * t_msg
            comm = m * 2 * t_msg
            bubble = (n - 1) * slot  # fill + drain: p-1 idle slots, as in bubble_fraction
            formula = (f"(m + p - 1) slots of compute/m + 2 sends of {message:.3g} B over "
                       f"{link.name}; m={m}, p={n}")
    total = compute + comm + bubble
    efficiency = compute / total if total > 0 else 1.0
    return StepPrediction(compute_s=compute, comm_s=comm, total_s=total,
                          efficiency=efficiency, bubble_s=bubble, hidden_comm_s=hidden_comm,
                          formula=formula)


def _required_int(name: str, value: int | None, example: str, strategy: str) -> int:
    if value is None:
        raise ConfigError(f"{name} (None) is required for strategy {strategy!r}; e.g. {example}")
    return check_int(name, value, 1, example)
