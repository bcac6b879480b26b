"""``labkit doctor --selftest``: every lesson's point, proved on this machine in a minute or two.

A new server (or laptop) either shows each lesson's effect or it does not, and an instructor
should learn which before a class does. The self-test runs one short, real check per lesson
on the backend it finds -- gloo on CPU cores, NCCL with one GPU per rank -- and prints a
table with a verdict per row: ``pass``, ``FAIL`` (how far off, and what it means) or
``skipped`` (why: no GPU, too few GPUs, no ``nvidia-smi``).

The rows: ranks start; DDP equals one process on the global batch; our ring all-reduce's bus
bandwidth beside the backend's own (nccl-tests' definition); bucketed DDP overlaps
communication with backward; the GPipe and 1F1B bubbles against ``(p-1)/(m+p-1)``; ZeRO 1-3
bytes per rank against the ZeRO paper (and, on a GPU, ``torch.cuda.max_memory_allocated``
against the prediction, the allocator's overhead named); TP bytes against Megatron-LM; MFU
against the measured peak (and on a GPU fp32 / bf16 matmuls against the datasheet); CUDA
events against the host clock; the link topology and what it means for TP placement.

``labkit.selftest.judge`` / ``judge_devices`` turn numbers into rows (pure, tested on
recorded numbers); ``checks`` / ``gpu`` make the numbers on real ranks; ``runner`` runs them
all on one warm ``labkit.Pool``.
"""

from __future__ import annotations

from labkit.selftest.rows import FAIL, PASS, SKIP, Row, SelftestReport
from labkit.selftest.runner import run_selftest

__all__ = ["FAIL", "PASS", "SKIP", "Row", "SelftestReport", "run_selftest"]
