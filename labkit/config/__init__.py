"""What a run is: ``RunConfig``, the strategy registry, metric records, link presets.

Torch-free, so the supervisor validates a config before any process starts.
``from labkit.config import RunConfig, ModelConfig`` is the public spelling; the classes
live in ``labkit.config.run``.
"""

from labkit.config.run import (
    BACKENDS,
    FAULT_KINDS,
    LAUNCHERS,
    MODEL_DEFAULTS,
    MODELS,
    OPTIMIZERS,
    FaultSpec,
    ModelConfig,
    RunConfig,
)

__all__ = ["BACKENDS", "FAULT_KINDS", "LAUNCHERS", "MODELS", "MODEL_DEFAULTS", "OPTIMIZERS",
           "FaultSpec", "ModelConfig", "RunConfig"]
