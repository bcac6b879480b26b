"""Problem set 3, instructor side: the hidden cases of the code exercises."""

from __future__ import annotations

SEED = 2718  # inputs of the hidden runs (the visible ones use seed 0)
RING_WORLD_SIZES = (3, 4)
RING_SIZES = (12, 13, 1001)
BUCKET_SIZES = (700, 3000, 5, 1999, 2001, 64)  # float32 elements
BUCKET_CAP = 8000  # bytes
PIPELINE_CASES = ((3, 5), (4, 4), (2, 1), (5, 7), (4, 12))
