"""The training skeleton every strategy stands on: one loop, a few hooks.

Data, pipeline, tensor and sharded parallelism all train the same way; what differs is
how a step's batch is split, how gradients become global, and what the optimizer updates.
``TrainLoop.run`` owns what is the same everywhere::

    resume from the last checkpoint (when asked)
    for each step:
        1. this rank's share of the step's global batch      batch(step)
        2. forward and traced backward on it                  forward_backward(x, y, step)
        3. gradients made global (averaged, reduced, kept)    sync(step)
        4. the optimizer step                                 update(step)
        5. a checkpoint every K steps                         (CheckpointOptions)
    the final parameters: their hash on the reporting rank and, with check_reference,
    the largest difference from ONE process trained on the global batch

A strategy subclasses ``TrainLoop`` and overrides only what its parallelism changes: the
bucketed DDP is ``sync``, ZeRO is ``sync`` + ``update`` + ``final_state``, a pipeline is
``forward_backward``. Its metrics go in a typed record (``labkit.config.metrics.RankMetrics``)
that the runner combines across ranks.

The batch is split along the grid's data axis only: tensor- and pipeline-parallel ranks of
one replica see the same samples (``labkit.base.grid``).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence
from typing import Any, Generic, TypeVar, cast

import torch
from torch import nn

from labkit.base.events import Op
from labkit.config.metrics import RankMetrics
from labkit.config.run import RunConfig
from labkit.rank.context import RankContext, RankOutput, RunContext
from labkit.train.data import Task
from labkit.train.models import task_for
from labkit.train.optim import make_optimizer
from labkit.train.reference import finish_run, reference_run
from labkit.train.training import BackwardClock, model_stats, traced_backward, unwrap_state

R = TypeVar("R", bound=RankMetrics)

_NO_AUTOCAST = contextlib.nullcontext()
"""fp32's forward context, made once (a ``nullcontext`` can be entered again and again)."""


class TrainLoop(Generic[R]):
    """One rank's training run; subclass and override the hooks your strategy changes.

    ``model`` is what forward calls (possibly wrapped, e.g. by DDP); ``full_model`` the
    plain, unsharded model it started from (checkpoints, parameter and FLOP counts; a
    strategy that must not keep it passes ``stats`` instead). ``params`` are the tensors
    the optimizer updates (default: the model's trainable parameters).
    """

    Record: type[RankMetrics] = RankMetrics
    """The strategy's metrics record (a ``RankMetrics`` subclass in a torch-free module);
    a subclass sets it and names it as the type parameter: ``TrainLoop[ZeroMetrics]``."""

    def __init__(self, ctx: RankContext, model: Any, *, full_model: nn.Module | None = None,
                 params: Sequence[torch.Tensor] | None = None, optimizer: Any = None,
                 checkpoint_module: nn.Module | None = None, clock: bool = True,
                 config: RunConfig | None = None, stats: tuple[int, int] | None = None,
                 task: Task | None = None):
        if config is None:
            if not isinstance(ctx, RunContext):
                raise TypeError("TrainLoop on a labkit.launch rank needs config=RunConfig(...): "
                                "only a labkit.run rank's context holds one")
            config = ctx.config
        self.ctx, self.cfg = ctx, config
        self.model = model
        self.full_model = full_model if full_model is not None else model
        self.stats = stats if stats is not None else model_stats(self.full_model)
        """(parameters, matmul weights) of the whole unsharded model."""
        self.params = list(params) if params is not None else [
            p for p in model.parameters() if p.requires_grad]
        self.optimizer = (optimizer if optimizer is not None
                          else make_optimizer(self.cfg.optimizer, self.params, self.cfg.lr))
        self.task = task if task is not None else task_for(self.cfg)
        self.clock = BackwardClock(self.params) if clock else None
        self.losses: list[float] = []
        self.record: R = cast(R, self.Record())
        self.checkpointer = self._checkpointer(checkpoint_module or self.full_model)
        cls = type(self)
        self._back_to_back = (self.clock is None and cls.sync is TrainLoop.sync
                              and cls.forward_backward is TrainLoop.forward_backward
                              and cls.update is TrainLoop.update)
        """The base hooks' forward, backward and optimizer step with nothing between them (no
        sync, no wait inside backward): traced as one chain of spans (``_compute_chained``)."""

    # ---- sizes ---------------------------------------------------------------------------
    @property
    def dp(self) -> int:
        """Data-parallel replicas (the grid's dp axis)."""
        return self.ctx.grid.dp if self.ctx.grid is not None else self.ctx.world_size

    @property
    def dp_rank(self) -> int:
        return self.ctx.dp_rank

    def global_batch(self) -> int:
        """Samples per optimizer step over all replicas."""
        return int(self.cfg.batch_size * self.dp)

    # ---- the hooks (override what your strategy changes) ---------------------------------
    def batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """1. This replica's contiguous shard of step ``step``'s global batch."""
        x, y = self.task.batch(step, self.global_batch(), self.dp_rank, self.dp)
        if self.ctx.device.type == "cpu":  # where the task made them
            return x, y
        return x.to(self.ctx.device), y.to(self.ctx.device)

    def zero_grad(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)

    def begin_step(self, step: int) -> None:
        """Called after zero_grad, before forward (tag hooks with the step, reset buffers)."""

    def loss(self, out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self.task.loss(out, y)

    @property
    def precision(self) -> str:
        """fp32, or bf16 where the strategy's options ask for mixed precision."""
        return str(getattr(self.cfg.options, "precision", "fp32"))

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        """The forward's precision: bf16 under ``torch.autocast`` (fp32 weights and
        gradients, bf16 matmuls), else nothing. A strategy that stores its weights in bf16
        itself (ZeRO's mixed precision) overrides this with a no-op."""
        if self.precision != "bf16":
            return _NO_AUTOCAST
        return torch.autocast(self.ctx.device.type, dtype=torch.bfloat16)

    def forward_backward(self, x: torch.Tensor, y: torch.Tensor, step: int) -> Any:
        """2. Forward and backward on this rank's data; returns the loss (tensor or float)."""
        with self.ctx.tracer.span(Op.FORWARD, step=step), self.autocast():
            loss = self.loss(self.model(x), y)
        traced_backward(self.ctx, loss, self.clock, step)
        return loss

    def sync(self, step: int) -> None:
        """3. Make the gradients global (no-op where backward already did, e.g. torch DDP)."""

    def update(self, step: int) -> None:
        """4. The optimizer step."""
        with self.ctx.tracer.span(Op.OPTIMIZER, step=step):
            self.optimizer.step()

    def final_state(self) -> dict[str, torch.Tensor]:
        """The final weights (CPU) under the reference model's names; every rank calls it
        (it is a collective where the weights are sharded)."""
        return unwrap_state(self.model)

    def reports_state(self) -> bool:
        """Whether this rank hashes ``final_state`` and checks it against the reference."""
        return self.ctx.rank == 0

    def reference_state(self) -> dict[str, torch.Tensor]:
        """One process trained on the global batch, same seed, same optimizer."""
        return reference_run(self.cfg, dp=self.dp).state

    def fill_record(self) -> None:
        """Put the strategy's own measurements in ``self.record`` (after training)."""

    # ---- the loop ------------------------------------------------------------------------
    def run(self) -> RankOutput:
        start, self.losses = self.checkpointer.start() if self.checkpointer else (0, [])
        walls = self.record.step_seconds = []
        cpus = self.record.step_cpu_seconds = []
        # one pair of readings between two steps ends one and starts the next (the process
        # CPU clock is a system call, slow just after a step's compute)
        saver = self.checkpointer if self.checkpointer and self.checkpointer.saves else None
        t0, c0 = time.perf_counter(), time.process_time()
        for step in range(start, self.cfg.steps):
            with self.ctx.step(step):
                self.train_step(step)
            t1, c1 = time.perf_counter(), time.process_time()
            walls.append(t1 - t0)
            cpus.append(c1 - c0)
            t0, c0 = t1, c1
            # 5. outside the step span and its times: saving is not training
            if saver is not None and saver.after_step(step, self.losses):
                t0, c0 = time.perf_counter(), time.process_time()
        return self.finish()

    def train_step(self, step: int) -> None:
        # 1. this rank's batch
        x, y = self.batch(step)
        self.zero_grad()
        self.begin_step(step)
        if self._back_to_back:  # 2.-4. the base hooks, timed with fewer clock readings
            loss = self._compute_chained(x, y, step)
        else:
            # 2. forward and backward on local data
            loss = self.forward_backward(x, y, step)
            # 3. gradients made global
            self.sync(step)
            # 4. the update
            self.update(step)
        if loss is not None:  # a pipeline's loss lives on its last stage only
            self.losses.append(float(loss.item()) if isinstance(loss, torch.Tensor)
                               else float(loss))

    def _compute_chained(self, x: torch.Tensor, y: torch.Tensor, step: int) -> torch.Tensor:
        """``forward_backward``, ``sync`` (a no-op) and ``update`` of the base class, their
        FORWARD, BACKWARD and OPTIMIZER spans end to end: one step of a bare model on one
        rank (a sub-millisecond MLP step sees each clock reading, ``bench/bench_step.py``)."""
        chain = self.ctx.tracer.chain(step)
        try:
            chain.next(Op.FORWARD)
            with self.autocast():
                loss = self.loss(self.model(x), y)
            chain.next(Op.BACKWARD)
            loss.backward()
            chain.next(Op.OPTIMIZER)
            self.optimizer.step()
        finally:  # a span that raised is recorded up to the raise, as a ``with`` span is
            chain.end()
        return loss

    def finish(self) -> RankOutput:
        rec = self.record
        num_params, matmul_params = self.stats
        rec.num_params = num_params
        rec.samples_per_step = self.global_batch()
        if self.task.tokens_per_sample > 1:
            rec.tokens_per_step = self.global_batch() * self.task.tokens_per_sample
        rec.flops_per_step = self.flops_per_step(matmul_params)
        self.fill_record()
        if self.checkpointer is not None and self.checkpointer.root:
            for key, value in self.checkpointer.metrics().items():
                setattr(rec, key, value)
        out = RankOutput(losses=self.losses, record=rec)
        state = self.final_state()
        if self.reports_state():
            out.params_sha256 = finish_run(state, self.cfg, rec, reference=self.reference_state,
                                           task=self.task)
        return out

    def flops_per_step(self, matmul_params: int) -> float:
        """Model FLOPs of one step: 6 per weight per sample or token (2 forward, 4 backward),
        plus attention's score and value matmuls for the GPT."""
        from labkit.theory import training_flops

        m = self.cfg.model
        if m.kind == "gpt":
            return training_flops(matmul_params, self.global_batch(), seq=m.seq_len,
                                  attention_layers=m.depth, hidden=m.width)
        return training_flops(matmul_params, self.global_batch())

    def _checkpointer(self, module: nn.Module) -> Any:
        opts = self.cfg.options
        if not hasattr(opts, "checkpoint_dir"):
            return None
        from labkit.train.checkpoint import Checkpointer, run_identity

        g = self.ctx.grid
        grid = None if g is None else {"dp": g.dp, "pp": g.pp, "tp": g.tp}
        return Checkpointer(self.ctx, opts.checkpoint_dir, opts.checkpoint_every, opts.resume,
                            module, self.optimizer,
                            identity=run_identity(self.cfg, self.ctx.world_size, grid))
