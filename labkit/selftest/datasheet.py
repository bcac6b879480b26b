"""What NVIDIA's datasheets promise per GPU: dense fp32 and bf16 peak FLOP/s.

The self-test sets a matmul it times on the GPU beside these numbers, so an instructor
sees how much of the datasheet this server really reaches, and MFU's denominator (the
*measured* peak, ``labkit.analysis.calibrate``) can be judged against the vendor's.

Numbers are **dense** (datasheets print the tensor-core rates "with sparsity", twice the
dense rate; we halve those): fp32 is the plain CUDA-core rate (no TF32), bf16 the tensor-core
rate. A measured fp32 matmul above the fp32 entry means TF32 was on
(``torch.backends.cuda.matmul.allow_tf32``), not a faster GPU.

Sources (checked 2025): NVIDIA H100 Tensor Core GPU datasheet (H100 SXM: fp32 67 TFLOP/s,
bf16 1,979 with sparsity = 989 dense; PCIe: 51 / 1,513 -> 756; NVL: 60 / 1,671 -> 835),
https://resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet ; NVIDIA H200
datasheet (SXM as H100 SXM; NVL 60 / 835), https://www.nvidia.com/en-us/data-center/h200/ ;
NVIDIA A100 datasheet (fp32 19.5, bf16 312 dense), https://www.nvidia.com/en-us/data-center/a100/ ;
NVIDIA L40S datasheet (91.6 / 733 with sparsity -> 362), NVIDIA L4 datasheet (30.3 / 242 ->
121), NVIDIA A10 datasheet (31.2 / 250 -> 125), https://www.nvidia.com/en-us/data-center/ .
"""

from __future__ import annotations

import re
from dataclasses import dataclass

T = 1e12


@dataclass(frozen=True)
class Datasheet:
    """One GPU model's dense peaks, as its datasheet prints them."""

    model: str
    fp32_flops: float
    bf16_flops: float
    source: str


_H100_SHEET = "NVIDIA H100 Tensor Core GPU datasheet"
_TABLE: tuple[tuple[str, Datasheet], ...] = (
    # more specific names first: "H100 PCIe" must not match the SXM entry, "GH200" not
    # "H200", "L40S" not "L4"
    (r"H100.*NVL", Datasheet("H100 NVL", 60 * T, 835 * T, _H100_SHEET)),
    (r"H100.*PCIE", Datasheet("H100 PCIe", 51 * T, 756 * T, _H100_SHEET)),
    (r"GH200", Datasheet("GH200 (H100 SXM class)", 67 * T, 989 * T, _H100_SHEET)),
    (r"H200.*NVL", Datasheet("H200 NVL", 60 * T, 835 * T, "NVIDIA H200 datasheet")),
    (r"H200", Datasheet("H200 SXM", 67 * T, 989 * T, "NVIDIA H200 datasheet")),
    (r"H100", Datasheet("H100 SXM", 67 * T, 989 * T, _H100_SHEET)),
    (r"A100", Datasheet("A100", 19.5 * T, 312 * T, "NVIDIA A100 datasheet")),
    (r"L40S", Datasheet("L40S", 91.6 * T, 362 * T, "NVIDIA L40S datasheet")),
    (r"\bL4\b", Datasheet("L4", 30.3 * T, 121 * T, "NVIDIA L4 datasheet")),
    (r"\bA10\b", Datasheet("A10", 31.2 * T, 125 * T, "NVIDIA A10 datasheet")),
)


def datasheet_for(device_name: str) -> Datasheet | None:
    """The datasheet of the GPU ``torch.cuda.get_device_name`` calls ``device_name``
    (e.g. "NVIDIA H100 80GB HBM3" -> H100 SXM); None for a GPU not in the table."""
    upper = device_name.upper()
    for pattern, sheet in _TABLE:
        if re.search(pattern, upper):
            return sheet
    return None
