"""Handwritten digits: 1,797 8x8 greyscale images of 0-9, shipped with labkit.

The UCI "Optical Recognition of Handwritten Digits" test set (Alpaydin and Kaynak 1998, CC BY
4.0: ``DIGITS_LICENSE.txt`` beside it), as the 57 KB CSV scikit-learn also ships; labkit reads
its own copy, so neither scikit-learn nor SciPy is installed for it. Pixels 0-16 are scaled to 0-1. A
seeded split keeps ``TEST`` images aside, so the final accuracy is measured on images the
model never trained on (seed 000's project: "report final accuracy").
"""

from __future__ import annotations

import functools
import gzip
from pathlib import Path

import numpy as np
import torch

from labkit.base.errors import LabError
from labkit.train.data.base import Task

TEST = 297
"""Images held out for the accuracy (1,500 remain for training)."""


CSV = Path(__file__).with_name("digits.csv.gz")


def _csv_path() -> Path:
    if not CSV.is_file():
        raise LabError(f"the digits data set {CSV} is missing from this labkit install: "
                       "reinstall it (`make setup`, or `pip install -e .`)")
    return CSV


@functools.cache
def _load() -> tuple[np.ndarray, np.ndarray]:
    with gzip.open(_csv_path(), "rt") as f:
        data = np.loadtxt(f, delimiter=",", dtype=np.float32)
    return data[:, :-1] / 16.0, data[:, -1].astype(np.int64)


class DigitsTask(Task):
    """8x8 digit images as 64 features; ``test_x`` / ``test_y`` are the held-out images."""

    in_dim = 64
    classes = 10

    def __init__(self, seed: int):
        x, y = _load()
        perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(seed + 2024))
        xs, ys = torch.from_numpy(x)[perm], torch.from_numpy(y)[perm]
        self.x, self.y = xs[TEST:], ys[TEST:]
        self.test_x, self.test_y = xs[:TEST], ys[:TEST]
        self.seed = seed

    def accuracy(self, model: torch.nn.Module) -> float:
        """Share of the held-out images ``model`` classifies correctly."""
        with torch.no_grad():
            pred = model(self.test_x).argmax(dim=1)
        return float((pred == self.test_y).float().mean())
