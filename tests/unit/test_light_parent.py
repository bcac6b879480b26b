"""The supervisor process stays light: importing labkit, listing strategies and validating
every strategy's default config must not import torch (it costs over a second)."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.lesson00


def test_registry_and_config_validation_never_import_torch():
    code = ("import sys, labkit; from labkit.config import registry; from labkit.config.run import "
            "RunConfig\n"
            "for name in registry.names():\n"
            "    RunConfig(strategy=name, world_size=2)\n"
            "from labkit.launchers.supervisor import supervise\n"
            "mods = sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.'))\n"
            "print(','.join(mods))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "", f"torch imported in the supervisor: {out.stdout.strip()}"


def test_labkit_run_stays_the_function_after_submodule_imports():
    """A submodule named like a package attribute would replace it on import."""
    import importlib

    import labkit

    importlib.import_module("labkit.launchers.runner")
    from labkit.api import launch  # noqa: F401

    assert callable(labkit.run) and labkit.run.__name__ == "run"
    assert callable(labkit.launch)
