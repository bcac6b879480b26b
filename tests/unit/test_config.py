"""RunConfig validation: bad input is rejected before any process starts, and the message
names every offending value and the rule."""

from __future__ import annotations

import pytest

from labkit.base import devices
from labkit.base.errors import ConfigError
from labkit.config.run import FaultSpec, ModelConfig, RunConfig

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


@pytest.mark.parametrize("kwargs, fragment", [
    ({"world_size": 2.0}, "world_size (2.0) must be an integer >= 1, not float"),
    ({"world_size": 2.5}, "world_size (2.5) must be an integer >= 1, not float"),
    ({"world_size": "2"}, "world_size ('2') must be an integer >= 1, not str"),
    ({"world_size": True}, "world_size (True) must be an integer >= 1, not bool"),
    ({"steps": 2.5}, "steps (2.5) must be an integer >= 1 and <= 100000, not float"),
    ({"steps": 10**9}, "steps (1000000000) must be >= 1 and <= 100000"),
    ({"seed": 1.5}, "seed (1.5) must be an integer >= 0 and <= 4294967295, not float"),
    ({"seed": 10**20}, "seed (100000000000000000000) must be >= 0 and <= 4294967295"),
    ({"seed": -1}, "seed (-1) must be >= 0"),
    ({"lr": "0.1"}, "lr ('0.1') must be a number > 0 and <= 100, not str"),
    ({"lr": float("inf")}, "lr (inf) must be a finite number > 0 and <= 100"),
    ({"lr": float("nan")}, "lr (nan) must be a finite number > 0"),
    ({"lr": True}, "lr (True) must be a number > 0 and <= 100, not bool"),
    ({"timeout_s": float("inf")}, "timeout_s (inf) must be a finite number > 0 and <= 604800"),
    ({"timeout_s": "60"}, "timeout_s ('60') must be a number > 0"),
    ({"batch_size": 1e6}, "batch_size (1000000.0) must be an integer >= 1 and <= 65536"),
    ({"threads_per_rank": 0.5}, "threads_per_rank (0.5) must be an integer >= 1"),
    ({"trace": "yes"}, "trace ('yes') must be True or False, not str"),
    ({"check_reference": 1}, "check_reference (1) must be True or False, not int"),
    ({"progress": "auto"}, "progress ('auto') must be True, False or None, not str"),
    ({"optimizer": 3}, "optimizer 3 must be one of sgd"),
    ({"backend": 3}, "backend 3 must be one of auto, gloo, nccl"),
    ({"strategy": ["ddp"]}, "strategy ['ddp'] is not registered"),
    ({"model": {"wdth": 64}},
     "model has unknown key(s) wdth; known: kind, in_dim, width, depth, out_dim"),
    ({"model": [64]},
     "model ([64]) must be a ModelConfig, a kind (mlp, gpt, digits) or a dict of its fields, "
     "not list"),
    ({"model": {"width": 1_000_000}}, "model.width (1000000) must be >= 1 and <= 65536"),
    ({"model": {"width": 2.5}}, "model.width (2.5) must be an integer >= 1 and <= 65536"),
    ({"model": {"width": 16384, "depth": 4}}, "parameters; it must have <= 250,000,000"),
    ({"inject_fault": {"rank": "1", "step": 2, "kind": "raise"}},
     "inject_fault rank ('1') must be an integer >= 0, not str"),
    ({"inject_fault": {"rank": 1, "step": 2.0, "kind": "raise"}},
     "inject_fault step (2.0) must be an integer >= 0, not float"),
    ({"inject_fault": "1.5:2:raise"}, "must look like RANK:STEP:KIND"),
    ({"options": {"checkpoint_dir": "ck", "checkpoint_every": 2.5}},
     "checkpoint_every (2.5) must be an integer >= 0, not float (steps; 0: never save)"),
    ({"options": {"checkpoint_dir": 3}}, "checkpoint_dir (3) must be a path (str) or None"),
    ({"options": {"checkpoint_dir": "ck", "resume": "yes"}}, "resume ('yes') must be True or"),
])
def test_types_and_sizes_are_checked_with_their_rule(kwargs, fragment):
    """Issue 14: every field's type and range, named with the rule, before any process."""
    with pytest.raises(ConfigError) as err:
        RunConfig(**{"strategy": "ddp", **kwargs})
    assert fragment in str(err.value), str(err.value)


def test_wrong_types_are_reported_together_not_as_a_bare_type_error():
    with pytest.raises(ConfigError) as err:
        RunConfig(strategy="ddp", world_size="2", steps=2.5, lr="0.1", seed=1.5,
                  inject_fault="1:3:raise")
    assert len(err.value.problems) == 4, err.value.problems


def test_a_model_given_as_a_dict_becomes_a_model_config():
    cfg = RunConfig(strategy="ddp", model={"width": 64, "depth": 2})
    assert cfg.model == ModelConfig(width=64, depth=2)
    assert cfg.to_json()["model"]["width"] == 64


def test_numpy_numbers_count_as_the_python_numbers_they_hold():
    import numpy as np

    cfg = RunConfig(strategy="ddp", world_size=np.int64(2), lr=np.float32(0.5), seed=np.uint8(3))
    assert type(cfg.world_size) is int and type(cfg.lr) is float and type(cfg.seed) is int


def test_model_parameters_count_the_mlp():
    from labkit.train.models import build_mlp

    m = ModelConfig(in_dim=5, width=7, depth=3, out_dim=2)
    assert m.parameters() == sum(p.numel() for p in build_mlp(m, 0).parameters())


def test_every_field_reads_resolved_and_the_config_is_frozen_for_real():
    """Issue 39: RunConfig resolves its defaults once, in ``resolve``; afterwards no field
    can be written (the dataclass is frozen, with no ``object.__setattr__`` behind it)."""
    import dataclasses

    cfg = RunConfig(strategy="ddp", model="gpt", inject_fault="1:3:raise",
                    options={"bucket_cap_mb": 1.0})
    assert (cfg.steps, cfg.lr, cfg.optimizer, cfg.batch_size) == (40, 0.1, "momentum", 32)
    assert cfg.model == ModelConfig(kind="gpt") and cfg.world_size == 2
    assert cfg.inject_fault == FaultSpec(rank=1, step=3, kind="raise")
    assert cfg.options.bucket_cap_mb == 1.0 and cfg.timeout_s >= 120.0
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.steps = 5  # type: ignore[misc]
    import inspect

    import labkit.config.run as run_module
    assert "object.__setattr__" not in inspect.getsource(run_module)


def test_pickles_copies_and_replace_keep_the_resolved_values():
    """A config crosses to the ranks pickled: it arrives equal, without being resolved (or
    validated) again; ``replace`` resolves and validates the changed copy."""
    import copy
    import pickle

    cfg = RunConfig(strategy="pipeline", model={"kind": "mlp", "width": 64}, steps=3)
    for twin in (pickle.loads(pickle.dumps(cfg)), copy.copy(cfg), copy.deepcopy(cfg)):
        assert twin == cfg and type(twin) is RunConfig and twin.options == cfg.options
    changed = cfg.replace(steps=5)
    assert changed.steps == 5 and changed.model.width == 64 and cfg.steps == 3
    with pytest.raises(ConfigError, match=r"steps \(0\) must be >= 1"):
        cfg.replace(steps=0)


def test_a_strategy_without_options_resolves_them_to_none():
    assert RunConfig(strategy="ddp-naive").options is None
    assert RunConfig(strategy="ddp-naive", options={}).options is None
