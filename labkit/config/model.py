"""The model a run trains (``ModelConfig``) and the training settings each kind uses unless
the run or its strategy says otherwise (``MODEL_DEFAULTS``).

Torch-free: the supervisor checks a model's shape and size before any process starts
(``labkit.train.models`` builds it inside the ranks).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from labkit.base.validate import int_problem

MAX_DIM = 65_536  # units of one layer (in_dim, width, out_dim)
MAX_DEPTH = 256
MAX_PARAMS = 250_000_000  # 1 GB of fp32 weights per copy, before gradients and optimizer state

MODELS = ("mlp", "gpt", "digits")

MODEL_DEFAULTS: dict[str, dict[str, Any]] = {
    "mlp": {"steps": 10, "lr": 0.05, "optimizer": "sgd", "timeout_s": 60.0},
    # momentum, not Adam: Adam's 1/sqrt(v) amplified float-rounding differences to 0.039
    # from one process over 40 GPT steps, past the 1e-5 reference checks
    "gpt": {"steps": 40, "lr": 0.1, "optimizer": "momentum", "timeout_s": 120.0},
    "digits": {"steps": 300, "lr": 0.1, "optimizer": "momentum", "timeout_s": 60.0},
}
"""Training settings a run of each model uses unless it (or its strategy) says otherwise:
enough for the loss to fall visibly in a default run of a few seconds."""


@dataclass(kw_only=True, frozen=True)
class ModelConfig:
    """The model a run trains: the seeded MLP (default), a small GPT or a digits classifier.

    ``kind`` picks the model and its data (``labkit.train.data``): ``mlp`` Linear+ReLU blocks on a
    synthetic classification task; ``gpt`` a decoder-only transformer (``labkit.train.models.gpt``)
    predicting the next character of Python's own source; ``digits`` Linear+ReLU blocks on
    the 8x8 handwritten digits (UCI, shipped with labkit), with the accuracy on held-out images reported.
    """

    kind: str = "mlp"
    """mlp, gpt or digits."""
    in_dim: int = 32
    """Input features per sample (mlp; digits images always have 64)."""
    width: int = 128
    """Hidden units per layer (gpt: the model width h)."""
    depth: int = 4
    """Hidden Linear+ReLU blocks (gpt: transformer blocks)."""
    out_dim: int = 10
    """Classes of the synthetic task (mlp; digits always has 10)."""
    heads: int = 4
    """Attention heads (gpt, and the blocks `labkit run tp` trains); width must be a multiple
    of heads."""
    seq_len: int = 64
    """Tokens per sample (gpt)."""
    vocab_size: int | None = None
    """gpt: None for characters (96 symbols) or N for the N most frequent word pieces."""

    def problems(self) -> list[str]:
        """Every broken rule (checked by the ``RunConfig`` that holds this model)."""
        limits = {"in_dim": MAX_DIM, "width": MAX_DIM, "depth": MAX_DEPTH, "out_dim": MAX_DIM,
                  "heads": MAX_DIM, "seq_len": MAX_DIM}
        out = [p for name, hi in limits.items()
               if (p := int_problem(f"model.{name}", getattr(self, name), 1, hi,
                                    example=getattr(ModelConfig, name))) is not None]
        if self.kind not in MODELS:
            out.append(f"model.kind {self.kind!r} must be one of {', '.join(MODELS)}; "
                       f"e.g. model='gpt'")
        if out:
            return out
        if self.kind == "gpt":
            if self.width % self.heads:
                out.append(f"model.width ({self.width}) must be a multiple of model.heads "
                           f"({self.heads}) so every head has the same size; e.g. width=128, "
                           f"heads=4")
            if self.seq_len < 2:
                out.append(f"model.seq_len ({self.seq_len}) must be >= 2 tokens; e.g. 64")
            if self.vocab_size is not None and (
                    int_problem("model.vocab_size", self.vocab_size, 97, 16384, example=2048)):
                out.append(f"model.vocab_size ({self.vocab_size!r}) must be None (characters) "
                           f"or an integer from 97 to 16384 word pieces; e.g. vocab_size=2048")
        if not out and self.parameters() > MAX_PARAMS:
            out.append(f"model ({self.kind}, width {self.width}, depth {self.depth}) has "
                       f"{self.parameters():,} parameters; it must have <= {MAX_PARAMS:,} (1 GB "
                       f"of fp32 weights per copy, before gradients and optimizer state); "
                       f"e.g. width=1024, depth=4")
        return out

    def parameters(self) -> int:
        """Weights and biases of the model (``labkit.train.training.build_model``)."""
        if self.kind == "gpt":
            from labkit.theory.parallel3d import gpt_params

            vocab = 96 if self.vocab_size is None else self.vocab_size
            return gpt_params(vocab, self.width, self.depth, self.seq_len)["total"]
        in_dim, out_dim = (64, 10) if self.kind == "digits" else (self.in_dim, self.out_dim)
        hidden = (in_dim + 1) * self.width + (self.depth - 1) * (self.width + 1) * self.width
        return int(hidden + (self.width + 1) * out_dim)
