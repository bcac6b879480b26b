"""RunConfig validation: bad input is rejected before any process starts, and the message
names every offending value and the rule."""

from __future__ import annotations

import pytest

from labkit import devices
from labkit.config import FaultSpec, ModelConfig, RunConfig
from labkit.errors import ConfigError

pytestmark = pytest.mark.lesson00


def test_defaults_are_valid_and_options_are_built():
    cfg = RunConfig(strategy="ddp")
    assert cfg.world_size == 2 and cfg.options.bucket_cap_mb == 25.0


@pytest.mark.parametrize("kwargs, fragment", [
    ({"world_size": 0}, "world_size (0) must be >= 1"),
    ({"steps": 0}, "steps (0) must be >= 1"),
    ({"timeout_s": 0}, "timeout_s (0) must be > 0"),
    ({"timeout_s": -5}, "timeout_s (-5) must be > 0"),
    ({"backend": "mpi2"}, "backend 'mpi2' must be one of auto, gloo, nccl"),
    ({"strategy": "dpp"}, "strategy 'dpp' is not registered; known: "),
    ({"optimizer": "adamw"}, "optimizer 'adamw' must be one of"),
    ({"batch_size": 0}, "batch_size (0) must be >= 1"),
    ({"model": ModelConfig(width=0)}, "model.width (0) must be >= 1"),
    ({"options": {"bucket_cap_mb": 0}}, "bucket_cap_mb (0) must be > 0"),
    ({"options": {"bucket_mb": 1}}, "unknown option(s) bucket_mb for strategy 'ddp'"),
    ({"inject_fault": "5:1:raise"}, "inject_fault rank (5) must be in 0..1"),
    ({"inject_fault": "0:99:raise"}, "inject_fault step (99) must be in 0..9"),
    ({"inject_fault": "0:1:explode"}, "inject_fault kind 'explode' must be one of"),
    ({"inject_fault": "zero"}, "must look like RANK:STEP:KIND"),
    ({"inject_fault": {"rank": 1, "when": 2}}, "must have exactly the keys rank, step and kind"),
    ({"inject_fault": 3}, "inject_fault 3 must be 'RANK:STEP:KIND'"),
    ({"inject_fault": {"rank": 1, "step": 2, "kind": "melt"}}, "kind 'melt' must be one of"),
])
def test_bad_values_are_named_with_their_rule(kwargs, fragment):
    base = {"strategy": "ddp"}
    with pytest.raises(ConfigError) as err:
        RunConfig(**{**base, **kwargs})
    assert fragment in str(err.value)


def test_every_problem_is_reported_at_once():
    with pytest.raises(ConfigError) as err:
        RunConfig(strategy="ddp", world_size=0, steps=0, timeout_s=0)
    assert len(err.value.problems) == 3


def test_nccl_needs_one_gpu_per_rank(monkeypatch):
    monkeypatch.setattr(devices, "gpu_count", lambda: 1)
    with pytest.raises(ConfigError, match=r"world_size \(2\) > GPUs visible \(1\)"):
        RunConfig(strategy="ddp", world_size=2, backend="nccl")


def test_auto_backend_picks_nccl_only_with_enough_gpus(monkeypatch):
    monkeypatch.setattr(devices, "gpu_count", lambda: 4)
    assert RunConfig(strategy="ddp", world_size=4).resolved_backend() == "nccl"
    monkeypatch.setattr(devices, "gpu_count", lambda: 2)
    assert RunConfig(strategy="ddp", world_size=4).resolved_backend() == "gloo"


def test_fault_spec_round_trips():
    f = FaultSpec.parse("1:3:hang")
    assert (f.rank, f.step, f.kind) == (1, 3, "hang") and str(f) == "1:3:hang"


def test_threads_default_share_the_cores(monkeypatch):
    monkeypatch.setattr(devices, "cpu_count", lambda: 8)
    assert RunConfig(strategy="ddp", world_size=4).threads() == 2
    assert RunConfig(strategy="ddp", world_size=16).threads() == 1


def test_config_json_is_plain():
    import json

    d = RunConfig(strategy="ddp", inject_fault="1:2:raise").to_json()
    assert json.loads(json.dumps(d))["inject_fault"] == "1:2:raise"


def test_inject_fault_as_a_dict_means_the_same_as_the_text() -> None:
    as_dict = RunConfig(strategy="ddp", inject_fault={"rank": 1, "step": 2, "kind": "raise"})
    assert as_dict.inject_fault == FaultSpec.parse("1:2:raise")
