"""Seeded models and data are built on the CPU whatever the default device is, so a GPU
rank (whose strategy sets its GPU as the default device) starts from exactly the weights
and batches of the CPU reference. A 'meta' default device stands in for a GPU here: any
factory call that ignores the rule would produce meta tensors (or fail on the generator)."""

from __future__ import annotations

import pytest
import torch

from labkit.config.run import ModelConfig
from labkit.train.data import SyntheticTask
from labkit.train.models import build_mlp

pytestmark = pytest.mark.lesson00


def test_model_and_data_ignore_the_default_device():
    ref_model, ref_task = build_mlp(ModelConfig(), 3), SyntheticTask(3, 32, 10)
    with torch.device("meta"):
        model, task = build_mlp(ModelConfig(), 3), SyntheticTask(3, 32, 10)
        x, y = task.batch(5, 64, 1, 2)
    assert all(p.device.type == "cpu" for p in model.parameters())
    assert x.device.type == "cpu" and y.device.type == "cpu"
    for (name, a), b in zip(ref_model.state_dict().items(), model.state_dict().values()):
        assert torch.equal(a, b), name
    rx, ry = ref_task.batch(5, 64, 1, 2)
    assert torch.equal(rx, x) and torch.equal(ry, y)


def test_tp_reference_and_batches_ignore_the_default_device():
    from labkit.train.data import ActivationTask
    from labkit.train.models import build_blocks

    ref = build_blocks(64, 2, 4, 3, 128, "mlp", 0)
    with torch.device("meta"):
        model = build_blocks(64, 2, 4, 3, 128, "mlp", 0)
        x, _ = ActivationTask(0, 3, 64).batch(1, 2)
    assert x.device.type == "cpu"
    for a, b in zip(ref.parameters(), model.parameters()):
        assert b.device.type == "cpu" and torch.equal(a, b)
