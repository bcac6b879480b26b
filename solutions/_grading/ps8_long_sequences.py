"""Problem set 8, instructor side: the hidden cases of the two exercises, per student.

Every hidden input is drawn from a generator seeded with ``SECRET`` and the student's id
(autograding passes it as ``student_id``), so each student merges other partial results, of
another shape, and runs the ring on another number of ranks with other blocks. The visible
tests use seed 0 and the sizes in ``labkit.grading.ring_checks``.
"""

from __future__ import annotations

import hashlib
import random

SECRET = "ps8-hidden-7e21"


def _rng(student: str, what: str) -> random.Random:
    return random.Random(f"{SECRET}:{what}:{student}")


def seed(student: str) -> int:
    """The seed of this student's hidden tensors."""
    return int(hashlib.sha256(f"{SECRET}:{student}".encode()).hexdigest()[:8], 16) % 1_000_003


def merge_shape(student: str) -> tuple[int, int, int, int]:
    """(batch, heads, queries, head_dim) of the hidden merge: at least 2 queries."""
    rng = _rng(student, "merge")
    return rng.randint(1, 3), rng.randint(1, 4), rng.randint(3, 9), rng.randint(2, 16)


def ring_world_sizes(student: str) -> tuple[int, ...]:
    """The hidden ring's world sizes: 3 or 4 ranks, then the other."""
    return (3, 4) if _rng(student, "ring").random() < 0.5 else (4, 3)


def ring_shape(student: str) -> tuple[int, int, int, int]:
    """One rank's block: (batch, heads, tokens, head_dim)."""
    rng = _rng(student, "block")
    return rng.randint(1, 2), rng.randint(1, 3), rng.randint(2, 6), rng.randint(2, 8)
