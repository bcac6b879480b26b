"""Activation memory: the bytes autograd keeps from the forward pass for the backward pass.

Teaches the fourth term of training memory, the one ZeRO does not shard. Model states
(``labkit.theory.memory``) grow with the parameters; activations grow with the batch and
the sequence, and for a transformer with the *square* of the sequence (attention scores).
Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models",
count them per transformer layer for 16-bit activations and 1-byte dropout masks (their
section 4 and Table 2), with s = sequence length, b = micro-batch, h = hidden size,
a = attention heads, t = tensor-parallel degree:

=========================================  ==============================
no parallelism (eq. 1)                      s*b*h*(34 + 5*a*s/h)
tensor parallel (eq. 2)                     s*b*h*(10 + 24/t + 5*a*s/(h*t))
tensor + sequence parallel (eq. 3)          s*b*h/t*(34 + 5*a*s/h)
selective recomputation (attention redone)  the 5*a*s/h term dropped
full recomputation                          2*s*b*h (the layer's input only)
=========================================  ==============================

Of the 34 bytes per s*b*h, 11 are kept in attention, 19 in the MLP and 4 by the two
LayerNorms (2-byte values, 1-byte dropout masks); 5*a*s/h is the attention scores: softmax
output (2 B), its dropout mask (1 B) and dropout output (2 B), a*s*s*b values each. For GPT-3
175B (a = 96, s = 2048, h = 12288) 5*a*s/h = 80 > 34: attention dominates, which is why
recomputing only it (selective) saves about 70 % for a few per cent more compute.

With a 1F1B pipeline the first stage keeps ``p`` microbatches of ``L/p`` layers in flight,
so the busiest GPU holds ``L`` layers' worth however many stages (their section 4.2.3);
``model_activation_bytes`` therefore ignores the pipeline degree. Embedding and output
layers (a few s*b*h values) are left out, as in the paper's per-layer tables.

The MLP analogue (``mlp_activation_bytes``) is exact for labkit's own Linear+ReLU model, and
``mlp_step_activation_bytes`` for its whole training step (the loss's saves and a
checkpointed input's fp32 included): lesson 05 measures it with saved-tensor hooks.
"""

from __future__ import annotations

from dataclasses import dataclass

from labkit.base.errors import ConfigError
from labkit.theory.batch import check_choice, check_int

RECOMPUTE = ("none", "selective", "full")
"""What the backward recomputes: nothing, the attention core (selective), whole layers."""


def layer_activation_bytes(seq: int, batch: int, hidden: int, heads: int, *, tp: int = 1,
                           sequence_parallel: bool = False, recompute: str = "none") -> float:
    """Bytes one transformer layer keeps for backward, per GPU (Korthikanti et al. 2022,
    Table 2; 16-bit activations, 1-byte dropout masks). See the module docstring for the
    equations. ``tp`` = t; ``sequence_parallel`` also splits the LayerNorm and dropout
    activations (the ``10`` of eq. 2) over t; ``recompute`` is ``"none"``,
    ``"selective"`` (drop the attention term) or ``"full"`` (keep 2*s*b*h, the input)."""
    s = check_int("seq", seq, 1, "seq=2048")
    b = check_int("batch", batch, 1, "batch=1")
    h = check_int("hidden", hidden, 1, "hidden=2560")
    a = check_int("heads", heads, 1, "heads=32")
    t = check_int("tp", tp, 1, "tp=8")
    check_choice("recompute", recompute, RECOMPUTE, "recompute='full'")
    sbh = float(s * b * h)
    if recompute == "full":
        return 2 * sbh
    attention = 0.0 if recompute == "selective" else sbh * 5 * a * s / (h * t)
    if sequence_parallel:
        return sbh * 34 / t + attention
    return sbh * (10 + 24 / t) + attention


def layer_norm_activation_bytes(seq: int, batch: int, hidden: int, *, layers: int = 1,
                                tp: int = 1, sequence_parallel: bool = False,
                                bytes_per_value: int = 4) -> float:
    """Bytes the two LayerNorms of ``layers`` transformer layers keep for backward, per rank:
    each keeps its input, ``s*b*h`` values -- Korthikanti et al. 2022's ``4*s*b*h`` at 2 B
    (part of the ``10`` of eq. 2 that tensor parallelism leaves whole). Sequence parallelism
    gives each of the ``tp`` ranks 1/t of the sequence there, so the bytes divide by t
    (eq. 3). fp32 (4 B) by default, as labkit trains; their per-token mean and 1/std
    (``2*s*b`` values per LayerNorm) are left out, as in the paper."""
    s = check_int("seq", seq, 1, "seq=64")
    b = check_int("batch", batch, 1, "batch=4")
    h = check_int("hidden", hidden, 1, "hidden=128")
    n = check_int("layers", layers, 0, "layers=2")
    t = check_int("tp", tp, 1, "tp=2")
    bpv = check_int("bytes_per_value", bytes_per_value, 1, "bytes_per_value=4")
    if sequence_parallel and s % t:
        raise ConfigError(f"tp ({t}) must divide seq ({s}) under sequence parallelism: each "
                          f"rank keeps s/t tokens; e.g. seq={s * t}, tp={t}")
    return float(n * 2 * s * b * h * bpv) / (t if sequence_parallel else 1)


@dataclass(frozen=True)
class TransformerShape:
    """A GPT-style model's shape, as the activation formulas need it."""

    layers: int
    """Transformer layers (L)."""
    hidden: int
    """Hidden size (h)."""
    heads: int
    """Attention heads (a)."""
    seq: int = 2048
    """Sequence length in tokens (s)."""
    micro_batch: int = 1
    """Sequences per micro-batch on one GPU (b)."""
    vocab: int = 50257
    """Vocabulary size (GPT-2/3's tokenizer); only ``params`` uses it."""

    def __post_init__(self) -> None:
        for name in ("layers", "hidden", "heads", "seq", "micro_batch", "vocab"):
            check_int(name, getattr(self, name), 1, f"{name}={getattr(TransformerShape, name, 32)}")
        if self.hidden % self.heads:
            raise ConfigError(f"hidden ({self.hidden}) must be a multiple of heads "
                              f"({self.heads}); e.g. hidden=2560, heads=32")

    @property
    def params(self) -> float:
        """About 12*L*h^2 + V*h parameters (blocks plus token embedding; Narayanan et al.
        2021's count without the small bias and LayerNorm terms)."""
        return 12.0 * self.layers * self.hidden ** 2 + self.vocab * self.hidden


GPT_3B = TransformerShape(layers=36, hidden=2560, heads=32)
"""A 3B GPT for seed 000's exercise 2: GPT-3 2.7B's width and heads (Brown et al. 2020,
Table 2.1) with 36 layers instead of 32, 12*L*h^2 + V*h = 2.96e9 parameters."""


def model_activation_bytes(shape: TransformerShape, *, tp: int = 1,
                           sequence_parallel: bool = False, recompute: str = "none") -> float:
    """Activation bytes on the busiest GPU while it trains ``shape``: ``L`` layers' worth
    (a 1F1B pipeline does not divide it, see the module docstring). With full
    recomputation the layer being recomputed in backward is alive on top of the kept
    inputs, so one layer's un-recomputed activations are added."""
    kept = shape.layers * layer_activation_bytes(
        shape.seq, shape.micro_batch, shape.hidden, shape.heads, tp=tp,
        sequence_parallel=sequence_parallel, recompute=recompute)
    if recompute == "full":
        kept += layer_activation_bytes(shape.seq, shape.micro_batch, shape.hidden, shape.heads,
                                       tp=tp, sequence_parallel=sequence_parallel)
    return kept


def transformer_activation_bytes(batch: int, seq: int, hidden: int, heads: int,
                                 layers: int = 1, bytes_per_value: int = 2,
                                 checkpointing: bool = False) -> float:
    """Activation bytes a transformer keeps for the backward pass (Korthikanti et al. 2022).

    Per layer, with 16-bit values and 1-byte dropout masks, no tensor/sequence parallelism:
    ``s*b*h*(34 + 5*a*s/h)`` bytes, where s = ``seq``, b = ``batch``, h = ``hidden``,
    a = ``heads``. The 34 is 16 saved values of size s*b*h at 2 B plus 2 one-byte dropout
    masks; the 5*a*s/h term is the attention scores (softmax output and its dropout output
    at 2 B, plus one mask). Other ``bytes_per_value`` rescale the values, not the masks:
    ``s*b*h*(16*bpv + 2) + a*s*s*b*(2*bpv + 1)``.
    ``checkpointing=True`` (full recomputation) keeps only each layer's input,
    ``s*b*h*bytes_per_value`` per layer; the one layer being recomputed during backward
    is briefly alive on top of that and is not counted here.
    """
    b = check_int("batch", batch, 1, "batch=8")
    s = check_int("seq", seq, 1, "seq=2048")
    h = check_int("hidden", hidden, 1, "hidden=4096")
    a = check_int("heads", heads, 1, "heads=32")
    n_layers = check_int("layers", layers, 1, "layers=32")
    bpv = check_int("bytes_per_value", bytes_per_value, 1, "bytes_per_value=2")
    if checkpointing:
        per_layer = float(s * b * h * bpv)
    else:
        per_layer = float(s * b * h * (16 * bpv + 2) + a * s * s * b * (2 * bpv + 1))
    return per_layer * n_layers


def mlp_saved_tensors(batch: int, widths: list[int],
                      final_relu: bool = True) -> list[dict[str, object]]:
    """What autograd saves for ``Linear(w0,w1), ReLU, Linear(w1,w2), ReLU, ...``.

    Each ``Linear`` saves its input (needed for the weight gradient) and its weight (a
    parameter, already in memory: not listed). Each ``ReLU`` saves its output (its gradient
    mask is ``output > 0``); the pre-activation is freed. A hidden ReLU's output IS the next
    Linear's input, so the two saves share one storage: ``shares_with`` names the earlier
    entry. Entries: ``layer``, ``saves``, ``shape`` (rows, columns), ``shares_with``.
    """
    check_int("batch", batch, 1, "batch=64")
    widths = _check_widths(widths)
    n_linear = len(widths) - 1
    out: list[dict[str, object]] = []
    for i in range(n_linear):
        # ReLU i-1 saved this tensor first; Linear i saves the very same storage again.
        shares = f"relu{i - 1}.output" if i > 0 else None
        out.append({"layer": f"linear{i}", "saves": "input", "shape": (batch, widths[i]),
                    "shares_with": shares})
        if final_relu or i < n_linear - 1:
            out.append({"layer": f"relu{i}", "saves": "output",
                        "shape": (batch, widths[i + 1]), "shares_with": None})
    return out


def _check_widths(widths: object) -> list[int]:
    if not isinstance(widths, (list, tuple)) or len(widths) < 2:
        raise ConfigError(
            f"widths ({widths!r}) must list at least an input and an output width; "
            "e.g. widths=[784, 256, 10]")
    return [check_int(f"widths[{i}]", w, 1, "widths=[784, 256, 10]")
            for i, w in enumerate(widths)]


def cross_entropy_saved_bytes(batch: int, classes: int) -> float:
    """What cross-entropy keeps for its backward over ``batch`` samples of ``classes``:
    its log-softmax output in fp32 (autocast runs the loss in fp32 whatever the logits),
    the int64 targets, and ``nll_loss``'s total weight, one fp32 scalar."""
    check_int("batch", batch, 1, "batch=64")
    check_int("classes", classes, 1, "classes=10")
    return float(batch * classes * 4 + batch * 8 + 4)


def mlp_step_activation_bytes(batch: int, widths: list[int], bytes_per_value: int = 4,
                              checkpointing: bool = False, final_relu: bool = True,
                              segment: int = 1) -> float:
    """All a training step of labkit's MLP classifier keeps for its backward, to the byte:
    the layers' saves (``mlp_activation_bytes``), the loss's (``cross_entropy_saved_bytes``,
    ``widths[-1]`` classes), and, at 16 bits with checkpointing, the network input's other
    half: checkpoint keeps its first block's input as it came in, fp32, and autocast casts
    it to 16 bits only inside the block (without checkpointing the first Linear keeps the
    16-bit cast). Lesson 05 measures it with saved-tensor hooks."""
    layers = mlp_activation_bytes(batch, widths, bytes_per_value, checkpointing, final_relu,
                                  segment)
    sizes = _check_widths(widths)
    fp32_input = batch * sizes[0] * (4 - bytes_per_value) if checkpointing and \
        bytes_per_value < 4 else 0
    return layers + fp32_input + cross_entropy_saved_bytes(batch, sizes[-1])


def mlp_activation_bytes(batch: int, widths: list[int], bytes_per_value: int = 4,
                         checkpointing: bool = False, final_relu: bool = True,
                         segment: int = 1) -> float:
    """Bytes autograd keeps alive for a stack of Linear+ReLU layers (see ``mlp_saved_tensors``).

    ``widths=[w0, ..., wL]`` builds L Linear layers, each followed by a ReLU (set
    ``final_relu=False`` when the last Linear has none). Counted once per storage: the
    network input ``batch*w0`` (saved by the first Linear) plus every ReLU output
    ``batch*w_i``. A saved-tensor-hooks measurement that sums every packed tensor counts
    hidden ReLU outputs twice and weights too: dedupe by storage and skip parameters.
    ``checkpointing=True`` means each Linear+ReLU block is checkpointed on its own, so only
    block inputs ``batch*(w0 + ... + w_{L-1})`` are kept (the block being recomputed in
    backward is extra and not counted). ``bytes_per_value`` is 4 for fp32.
    Note that with ``segment=1`` this saves almost nothing: a block's only saved tensor
    besides its input is its ReLU output, which is the next block's input anyway.
    ``segment=k`` checkpoints k consecutive Linear+ReLU blocks as one segment, keeping only
    segment inputs; with ``final_relu=False`` the last Linear is not checkpointed and
    keeps its own input.
    """
    check_int("batch", batch, 1, "batch=64")
    sizes = _check_widths(widths)
    bpv = check_int("bytes_per_value", bytes_per_value, 1, "bytes_per_value=4")
    k = check_int("segment", segment, 1, "segment=2")
    if checkpointing:
        blocks = len(sizes) - 1 if final_relu else len(sizes) - 2
        values = sum(sizes[j] for j in range(0, blocks, k))
        if not final_relu:
            values += sizes[-2]
    else:
        relu_outputs = sizes[1:] if final_relu else sizes[1:-1]
        values = sizes[0] + sum(relu_outputs)
    return float(batch * values * bpv)
