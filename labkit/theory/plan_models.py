"""What the planner is asked about: a decoder-only model, a cluster of GPUs, the training run.

Teaches that "will it fit, how fast, which layout" starts from a handful of published numbers:
a model's shape, a GPU's datasheet peak and memory, the links inside and between nodes.

* **Models** (``MODELS``): decoder-only transformers given by layers, hidden size, heads, KV
  heads (grouped-query attention, Ainslie et al. 2023), FFN size (and whether it is SwiGLU,
  Shazeer 2020), vocabulary and sequence length. Presets: the lab's GPT
  (``labkit.train.models.gpt``, counted as ``labkit.theory.gpt_params`` counts it), GPT-3
  175B (Brown et al. 2020, Table 2.1), Llama 3 8B / 70B / 405B (Llama Team 2024, "The Llama
  3 Herd of Models", Table 3: 32 / 80 / 126 layers, model dimension 4096 / 8192 / 16384,
  FFN 14336 / 28672 / 53248, 32 / 64 / 128 heads, 8 KV heads, SwiGLU, vocabulary 128,000
  -- 128,256 in the released tokenizer) and Megatron's 1T (Narayanan et al. 2021, Table 1:
  128 layers, hidden 25600, 160 heads, vocabulary 51,200, sequence 2048).
* **GPUs** (``GPUS``): dense (no sparsity) bf16 and fp32 peaks and HBM from NVIDIA's
  datasheets (A100 40/80 GB: 312 / 19.5 TFLOP/s; H100 SXM and H200: 989 / 67; B200 (HGX):
  2250 / 75, 180 GB), their NVLink, and the measured Maximum Achievable Matmul FLOPS
  (MAMF, stas00/ml-engineering ``compute/accelerator/README.md``: A100 SXM 85.9 %, H100 SXM
  80.1 %, B200 77.6 % of the bf16 peak on the best GEMM shape; H200 has H100's chip).
* **Links** come from ``labkit.theory.interconnect``'s datasheet presets (NVLink 3 / 4,
  InfiniBand HDR / NDR); B200's NVLink 5 (1.8 TB/s both directions together, HGX B200
  datasheet) is defined here so that the lab's preset table stays the one the emulated
  cluster mirrors.

Units: bytes, seconds, FLOP/s; GB = 1e9 bytes.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from labkit.base.errors import ConfigError
from labkit.theory.activations import RECOMPUTE
from labkit.theory.batch import check_choice, check_int, check_number
from labkit.theory.interconnect import INTERCONNECTS, Interconnect
from labkit.theory.memory import OPTIMIZERS, PRECISIONS

GB = 1e9


@dataclass(frozen=True)
class Decoder:
    """A decoder-only transformer, as the planner counts it (``12 L h^2`` generalised)."""

    name: str
    layers: int
    """Transformer layers (L)."""
    hidden: int
    """Model width (h)."""
    heads: int
    """Query heads (a)."""
    kv_heads: int
    """Key/value heads (GQA; = heads for multi-head attention)."""
    ffn: int
    """FFN inner size (4h for GPT; Llama 3's are in its Table 3)."""
    swiglu: bool
    """A gated FFN (three matrices: gate, up, down) instead of two."""
    vocab: int
    """Vocabulary size (V)."""
    seq: int
    """Default sequence length (s) in tokens."""
    bias: bool = False
    """GPT-style biases and LayerNorm with bias (13 h per layer, as ``gpt_params``); else
    RMSNorm weights only (2 h per layer)."""
    learned_positions: bool = False
    """A learned position table (s x h); RoPE models have none."""
    tied: bool = False
    """Output head shares the token embedding."""

    def __post_init__(self) -> None:
        for name in ("layers", "hidden", "heads", "kv_heads", "ffn", "vocab", "seq"):
            check_int(name, getattr(self, name), 1, f"{name}=32")
        if self.hidden % self.heads or self.heads % self.kv_heads:
            raise ConfigError(f"hidden ({self.hidden}) must be a multiple of heads ({self.heads}) "
                              f"and heads a multiple of kv_heads ({self.kv_heads}); e.g. "
                              f"hidden=4096, heads=32, kv_heads=8")

    def with_seq(self, seq: int) -> Decoder:
        """The same model trained on ``seq``-token sequences."""
        return replace(self, seq=check_int("seq", seq, 1, "seq=8192"))

    @property
    def kv_ratio(self) -> float:
        """kv_heads / heads: the share of K and V in a multi-head attention's K and V."""
        return self.kv_heads / self.heads

    @property
    def gpt_shaped(self) -> bool:
        """Korthikanti et al.'s model: MHA, a 4h non-gated FFN (their per-layer tables)."""
        return self.kv_heads == self.heads and not self.swiglu and self.ffn == 4 * self.hidden

    @property
    def layer_matmul_params(self) -> float:
        """Weights of one layer's matrix multiplies: Q and O (2 h^2), K and V
        (2 h^2 kv/a), the FFN (3 h f gated, 2 h f not)."""
        h = self.hidden
        return 2 * h * h * (1 + self.kv_ratio) + (3 if self.swiglu else 2) * h * self.ffn

    @property
    def layer_params(self) -> float:
        """One layer's parameters: matmul weights plus biases and norms."""
        h = self.hidden
        small = 13 * h if self.bias else 2 * h
        return self.layer_matmul_params + small

    @property
    def embedding_params(self) -> float:
        """Token embedding (V h) plus learned positions (s h) if any."""
        return self.vocab * self.hidden + (self.seq * self.hidden if self.learned_positions else 0)

    @property
    def head_params(self) -> float:
        """Final norm plus the output projection (V h, 0 when tied)."""
        norm = 2 * self.hidden if self.bias else self.hidden
        return norm + (0 if self.tied else self.vocab * self.hidden)

    @property
    def params(self) -> float:
        """Every parameter: embeddings, L layers, final norm and head."""
        return self.embedding_params + self.layers * self.layer_params + self.head_params

    @property
    def matmul_params(self) -> float:
        """The N of 6 N FLOPs per token: every layer's matmuls plus the logit projection
        (the embedding lookup does no multiply); Narayanan et al.'s eq. 3 counts the same."""
        return self.layers * self.layer_matmul_params + self.vocab * self.hidden


def _gpt(name: str, layers: int, hidden: int, heads: int, vocab: int, seq: int) -> Decoder:
    return Decoder(name, layers, hidden, heads, heads, 4 * hidden, False, vocab, seq,
                   bias=True, learned_positions=True)


def _llama(name: str, layers: int, hidden: int, heads: int, ffn: int) -> Decoder:
    return Decoder(name, layers, hidden, heads, 8, ffn, True, 128256, 8192)


MODELS: dict[str, Decoder] = {m.name: m for m in (
    _gpt("lab-gpt", 4, 128, 4, 96, 64),  # labkit's GPT defaults (ModelConfig, characters)
    _gpt("gpt3-175b", 96, 12288, 96, 50257, 2048),  # Brown et al. 2020, Table 2.1
    _llama("llama3-8b", 32, 4096, 32, 14336),  # Llama Team 2024, Table 3
    _llama("llama3-70b", 80, 8192, 64, 28672),
    _llama("llama3-405b", 126, 16384, 128, 53248),
    _gpt("megatron-1t", 128, 25600, 160, 51200, 2048),  # Narayanan et al. 2021, Table 1
)}


def get_model(name: str) -> Decoder:
    """The preset called ``name``, or a ConfigError listing them."""
    check_choice("model", name, tuple(MODELS), "model='llama3-8b'")
    return MODELS[name]


@dataclass(frozen=True)
class GPU:
    """One accelerator: datasheet peaks, memory, and its measured best-GEMM rate."""

    name: str
    bf16_flops: float
    """Dense bf16 tensor-core peak, FLOP/s (datasheet, without sparsity)."""
    fp32_flops: float
    """Plain fp32 peak, FLOP/s (datasheet; not TF32)."""
    memory_bytes: float
    """HBM capacity, bytes (datasheet GB)."""
    nvlink: Interconnect
    """The link between GPUs of one node."""
    mamf: float
    """Maximum achievable matmul FLOPS as a share of the bf16 peak (measured; see module)."""
    note: str = ""
    layer_s: float = 0.0
    """Fixed seconds per transformer layer per microbatch, forward and backward, whatever
    its size: per-op work no FLOP rate sees (measured on a CPU, ``plan_local``; 0 here)."""
    step_s: float = 0.0
    """Fixed seconds per optimizer step per rank (embedding, head, loss, optimizer, the
    loop's bookkeeping; measured on a CPU, ``plan_local``; 0 for a GPU preset)."""

    def peak(self, precision: str) -> float:
        """The peak a ``precision`` run's MFU is measured against."""
        return self.bf16_flops if precision == "mixed" else self.fp32_flops


NVLINK5 = Interconnect("nvlink5", 2e-6, 900e9, "intra-node",
                       "B200 NVLink 5: 1.8 TB/s both directions together (HGX B200 datasheet)")

GPUS: dict[str, GPU] = {g.name: g for g in (
    GPU("a100-40gb", 312e12, 19.5e12, 40 * GB, INTERCONNECTS["nvlink3"], 0.859,
        "NVIDIA A100 datasheet: 312 TFLOP/s bf16 dense, 19.5 fp32, 40 GB HBM2"),
    GPU("a100-80gb", 312e12, 19.5e12, 80 * GB, INTERCONNECTS["nvlink3"], 0.859,
        "NVIDIA A100 datasheet: 312 TFLOP/s bf16 dense, 19.5 fp32, 80 GB HBM2e"),
    GPU("h100-sxm", 989e12, 67e12, 80 * GB, INTERCONNECTS["nvlink4"], 0.801,
        "NVIDIA H100 SXM datasheet: 989 TFLOP/s bf16 dense (1,979 with sparsity), 67 fp32, "
        "80 GB HBM3"),
    GPU("h200", 989e12, 67e12, 141 * GB, INTERCONNECTS["nvlink4"], 0.801,
        "NVIDIA H200 SXM datasheet: H100's compute, 141 GB HBM3e"),
    GPU("b200", 2250e12, 75e12, 180 * GB, NVLINK5, 0.776,
        "NVIDIA HGX B200 datasheet: 2.25 PFLOP/s bf16 dense (4.5 with sparsity), 75 fp32, "
        "180 GB HBM3e per GPU"),
)}

# The network between nodes each GPU generation usually ships with: one NIC per GPU
# (DGX A100: 8 x ConnectX-6 HDR; DGX H100 / H200 / B200: 8 x ConnectX-7 NDR).
DEFAULT_INTER = {"a100-40gb": "infiniband_hdr", "a100-80gb": "infiniband_hdr",
                 "h100-sxm": "infiniband_ndr", "h200": "infiniband_ndr", "b200": "infiniband_ndr"}


def get_gpu(name: str) -> GPU:
    """The preset called ``name``, or a ConfigError listing them."""
    check_choice("gpu", name, tuple(GPUS), "gpu='h100-sxm'")
    return GPUS[name]


@dataclass(frozen=True)
class Cluster:
    """``gpus`` GPUs, ``per_node`` to a node; ``intra`` links GPUs of a node, ``inter``
    nodes (per GPU: one NIC each)."""

    gpu: GPU
    gpus: int
    per_node: int
    intra: Interconnect
    inter: Interconnect
    cores: int | None = None
    """Processors the ranks share (a CPU machine's cores), or None: each GPU computes on
    its own."""

    def __post_init__(self) -> None:
        check_int("gpus", self.gpus, 1, "gpus=1024")
        if self.cores is not None:
            check_int("cores", self.cores, 1, "cores=2")
        check_int("per_node", self.per_node, 1, "per_node=8")
        if self.gpus > self.per_node and self.gpus % self.per_node:
            raise ConfigError(f"gpus ({self.gpus}) must be a multiple of per_node "
                              f"({self.per_node}) to fill whole nodes; e.g. gpus="
                              f"{self.per_node * max(1, self.gpus // self.per_node)}")


def cluster(gpu: str, gpus: int, per_node: int = 8, inter: str | None = None) -> Cluster:
    """A cluster of preset GPUs; ``inter`` names an interconnect preset (default: the
    network that GPU's DGX node ships with)."""
    g = get_gpu(gpu)
    link = INTERCONNECTS[check_choice("inter", inter or DEFAULT_INTER[g.name],
                                      tuple(INTERCONNECTS), "inter='infiniband_ndr'")]
    return Cluster(g, gpus, per_node, g.nvlink, link)


@dataclass(frozen=True, kw_only=True)
class Training:
    """The run: how many tokens a step sees, in which precision, with which optimizer."""

    global_batch_tokens: float
    """Tokens per optimizer step (global batch x sequence length)."""
    precision: str = "mixed"
    """"mixed" (bf16 weights and activations, fp32 master weights) or "fp32"."""
    optimizer: str = "adam"
    """"adam", "momentum" or "sgd" (``labkit.theory.bytes_per_param``)."""
    recompute: str | None = None
    """"none", "selective", "full", or None: the planner picks the cheapest that fits."""
    flash_attention: bool = True
    """Attention scores are never stored (Dao et al. 2022); False for runs before it."""
    dropout: bool = False
    """Dropout masks kept for backward (GPT-3 / Megatron 2021 trained with dropout)."""
    fp32_grads: bool = True
    """Gradients accumulated and reduced in fp32 (Megatron's main_grad, Llama 3 section
    3.3.2, torchtitan's reduce dtype); False: 16-bit gradients."""

    def __post_init__(self) -> None:
        check_number("global_batch_tokens", self.global_batch_tokens,
                     "global_batch_tokens=16e6", allow_equal=False)
        check_choice("precision", self.precision, PRECISIONS, "precision='mixed'")
        check_choice("optimizer", self.optimizer, OPTIMIZERS, "optimizer='adam'")
        if self.recompute is not None:
            check_choice("recompute", self.recompute, RECOMPUTE, "recompute='selective'")

    @property
    def value_bytes(self) -> int:
        """Bytes of one activation or working-weight value."""
        return 2 if self.precision == "mixed" else 4

    @property
    def grad_bytes(self) -> int:
        """Bytes of one gradient value as it is kept and reduced."""
        return 4 if self.fp32_grads or self.precision == "fp32" else 2
