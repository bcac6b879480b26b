"""How much arithmetic a training step is: model FLOPs, the numerator of MFU.

Teaches: a matrix-multiply layer with ``N`` weights costs ``2N`` FLOPs per sample (or per
token) in the forward pass (a multiply and an add per weight) and ``4N`` in the backward
(gradient w.r.t. the input and w.r.t. the weights), so training costs about ``6N`` FLOPs
per sample (Kaplan et al. 2020). Attention adds the score and value matmuls, which have no
weights: ``12 * layers * seq * hidden`` FLOPs per token for forward + backward (Chowdhery
et al. 2022, PaLM, appendix B). Embeddings, norms, biases and activations are left out,
as both papers do: they are a few percent at most.

These are *model* FLOPs: the work the model needs, whatever the strategy does extra
(recomputation under activation checkpointing or ZeRO-3 is not counted), so MFU compares
strategies on the same footing.
"""

from __future__ import annotations

from labkit.theory.batch import check_int


def training_flops(matmul_params: int, samples: int, *, seq: int = 1, attention_layers: int = 0,
                   hidden: int = 0) -> float:
    """Model FLOPs of one training step: ``(6 N + 12 L s h) x tokens``.

    ``matmul_params`` N counts the weights of the matrix multiplies (not embeddings);
    ``samples`` x ``seq`` is the number of tokens (``seq`` = 1 for an MLP); ``attention_layers``
    L with ``hidden`` h adds the attention scores of sequence length ``seq``.
    """
    n = check_int("matmul_params", matmul_params, 0, "matmul_params=1_000_000")
    b = check_int("samples", samples, 0, "samples=32")
    s = check_int("seq", seq, 1, "seq=64")
    layers = check_int("attention_layers", attention_layers, 0, "attention_layers=4")
    h = check_int("hidden", hidden, 0, "hidden=128")
    tokens = b * s
    return float(6 * n * tokens + 12 * layers * s * h * tokens)
