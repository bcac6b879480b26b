"""Problem set 3, instructor side: the hidden cases of the code exercises, per student.

Every hidden input is drawn from a generator seeded with ``SECRET`` and the student's id
(autograding passes it as ``student_id``), so each student's ranks sum other tensors, of
other sizes, accumulate other gradients over another number of micro-steps, and shard
another model; a feedback line that names a size helps no one else. The visible tests use
seed 0 and the sizes in ``labkit.grading``.
"""

from __future__ import annotations

import hashlib
import random

SECRET = "ps3-hidden-51c9"
DOUBLING_WORLD_SIZES = (2, 4)  # recursive doubling needs a power of two
BUCKET_CAP = 8000  # bytes
ZERO_WORLD_SIZE = 4


def _rng(student: str, what: str) -> random.Random:
    return random.Random(f"{SECRET}:{what}:{student}")


def seed(student: str) -> int:
    """The seed of this student's hidden tensors."""
    return int(hashlib.sha256(f"{SECRET}:{student}".encode()).hexdigest()[:8], 16) % 1_000_003


def doubling_sizes(student: str) -> tuple[int, int, int]:
    """A size 4 divides, a small odd one, a larger odd one."""
    rng = _rng(student, "doubling")
    return 4 * rng.randint(2, 12), 2 * rng.randint(6, 20) + 1, 2 * rng.randint(400, 600) + 1


def bucket_sizes(student: str) -> tuple[int, ...]:
    """Six float32 gradients: one larger than the cap, small ones that share a bucket."""
    rng = _rng(student, "buckets")
    return (rng.randint(500, 900), rng.randint(2500, 3500), rng.randint(1, 9),
            rng.randint(1800, 2100), rng.randint(1900, 2300), rng.randint(32, 96))


def accumulate_every(student: str) -> int:
    """Micro-steps per optimizer step of the hidden accumulation test (the visible one: 2)."""
    return _rng(student, "every").choice((3, 4))


def zero_sizes(student: str) -> tuple[int, ...]:
    """Four tensors whose total ZERO_WORLD_SIZE does not divide (the shards need padding)."""
    rng = _rng(student, "zero")
    sizes = [rng.randint(3, 40) for _ in range(4)]
    if sum(sizes) % ZERO_WORLD_SIZE == 0:
        sizes[-1] += rng.randint(1, ZERO_WORLD_SIZE - 1)
    return tuple(sizes)


def pipeline_cases(student: str) -> tuple[tuple[int, int], ...]:
    """(stages, microbatches): fewer microbatches than stages, as many, more, and one."""
    rng = _rng(student, "pipeline")
    p = rng.randint(3, 5)
    return ((p, rng.randint(p + 1, 3 * p)), (p + 1, p + 1), (2, 1), (rng.randint(4, 5),
            rng.randint(2, 3)), (4, rng.randint(9, 14)))
