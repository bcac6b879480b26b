"""Pipeline parallelism (lesson 03).

``labkit run pipeline --schedule gpipe|1f1b|interleaved|zb --stages P --microbatches M
[--virtual V]`` runs a plan from ``labkit.schedules`` on P real ranks (see ``executor``).
``--orders "0F0 0F1 0B0 0B1; 1F0 1B0 1F1 1B1"`` runs a hand-written plan instead (one
``;``-separated list of actions per rank), e.g. a student's 1F1B.

Every rule is checked here, before any process starts: the schedule's own rules (the
interleaved schedule needs microbatches to be a multiple of stages), one rank per stage,
at least one layer per model stage, and a batch that splits into equal microbatches.

The options, metrics record and registration live in ``options`` (torch-free); this package
re-exports them.
"""

from labkit.strategies.pipeline.options import (
    BALANCE,
    PipelineOptions,
    check,
    lesson_mlp_shape,
    options_for,
    orders_text,
    parse_orders,
    pipeline_model,
    plan_for,
)

__all__ = ["BALANCE", "PipelineOptions", "check", "lesson_mlp_shape", "options_for", "orders_text",
           "parse_orders", "pipeline_model", "plan_for"]
