"""Code checks of problem set 3 on relayed ranks: the lessons' own code (lesson 01's ring,
its bucket sync every micro-step), a direct dist call, a collective, a deadlock and the usual
slips (Adam without bias correction, an all-reduce where ZeRO reduce-scatters, no padding)
lose the right part with feedback that says what to try; honest code passes every part."""

from __future__ import annotations

import pytest

from labkit.grading import code_checks
from tests.support.rank_code import rank_function

pytestmark = [pytest.mark.distributed, pytest.mark.grading, pytest.mark.lesson08]


def everyone_sends_everything(ctx, tensor):  # type: ignore[no-untyped-def]
    """Right sums, wrong traffic: (n-1) messages of the whole tensor instead of log2(n)."""
    import torch

    n, total = ctx.world_size, tensor.clone()
    for k in range(1, n):
        handle = ctx.comm.isend(tensor.clone(), (ctx.rank + k) % n)
        buf = torch.empty_like(tensor)
        ctx.comm.recv(buf, (ctx.rank - k) % n)
        handle.wait()
        total += buf
    tensor.copy_(total)


def calls_torch_directly(ctx, tensor):  # type: ignore[no-untyped-def]
    from torch.distributed import all_reduce

    all_reduce(tensor)  # bypasses ctx.comm: there is no process group to reach


def calls_a_collective(ctx, tensor):  # type: ignore[no-untyped-def]
    ctx.comm.all_reduce(tensor)  # the right sum, but the task forbids collectives


def waits_for_the_wrong_neighbour(ctx, tensor):  # type: ignore[no-untyped-def]
    ctx.comm.recv(tensor, (ctx.rank + 1) % ctx.world_size)  # every rank receives, none sends


def ring(ctx, tensor):  # type: ignore[no-untyped-def]
    """Lesson 01's ring: the right sums, 2(n-1) chunks of 1/n."""
    import torch

    n, rank = ctx.world_size, ctx.rank
    chunks = list(torch.tensor_split(tensor, n))
    for phase in range(2):
        for k in range(n - 1):
            send_i = (rank - k + phase) % n
            recv_i = (send_i - 1) % n
            incoming = torch.empty_like(chunks[recv_i])
            handle = ctx.comm.isend(chunks[send_i].contiguous(), (rank + 1) % n)
            ctx.comm.recv(incoming, (rank - 1) % n)
            handle.wait()
            if phase == 0:
                chunks[recv_i] += incoming
            else:
                chunks[recv_i].copy_(incoming)


def doubling(ctx, tensor):  # type: ignore[no-untyped-def]
    import torch

    distance = 1
    while distance < ctx.world_size:
        incoming = torch.empty_like(tensor)
        handle = ctx.comm.isend(tensor, ctx.rank ^ distance)
        ctx.comm.recv(incoming, ctx.rank ^ distance)
        handle.wait()
        tensor += incoming
        distance *= 2


def test_the_lessons_ring_loses_the_traffic_part_and_is_named() -> None:
    """Lesson 01's ring sums right, but its traffic is not recursive doubling's: the
    feedback names the ring and gives log2(n) x S (2 x 96 B on 4 ranks, not 1.5 x 96)."""
    verdict = code_checks.check_doubling_allreduce(ring, world_sizes=(4,), sizes=(12,))
    assert "[ok] right sums on 4 ranks" in verdict.feedback
    assert "[failed] log2(n) messages" in verdict.feedback
    assert "6 messages, [144, 144, 144, 144] B in all: that is lesson 01's ring" in verdict.feedback
    assert "2 x 96 = 192 B per rank" in verdict.feedback
    assert "2 / 4 points" in verdict.feedback


def test_sending_to_everyone_fails_on_messages_with_the_numbers() -> None:
    verdict = code_checks.check_doubling_allreduce(everyone_sends_everything, world_sizes=(4,),
                                                   sizes=(13,))
    assert not verdict.passed
    assert "ranks sent [312, 312, 312, 312] B in [3, 3, 3, 3] messages" in verdict.feedback
    assert "log2(n) x S = 2 x 104 = 208 B" in verdict.feedback


def test_honest_recursive_doubling_passes_every_part() -> None:
    verdict = code_checks.check_doubling_allreduce(doubling, world_sizes=(2, 4), sizes=(12, 13))
    assert verdict.passed, verdict.feedback
    assert "4 / 4 points" in verdict.feedback


def test_direct_torch_distributed_call_finds_no_process_group() -> None:
    """Ranks of a relayed exercise have no process group: dist.all_reduce has no one to
    talk to, and the feedback says where the messages must go instead."""
    verdict = code_checks.check_doubling_allreduce(calls_torch_directly, world_sizes=(2,),
                                                   sizes=(12,))
    assert not verdict.passed
    assert "Default process group has not been initialized" in verdict.feedback
    assert "no process group: they talk only through ctx.comm" in verdict.feedback


def test_a_collective_through_ctx_comm_fails_the_gate() -> None:
    verdict = code_checks.check_doubling_allreduce(calls_a_collective, world_sizes=(2,),
                                                   sizes=(12,))
    assert not verdict.passed
    assert "used built-in collective(s) ['all_reduce']" in verdict.feedback
    assert "0 / 4 points" in verdict.feedback


def test_a_deadlock_is_named_at_once_not_timed_out() -> None:
    """The relay sees every rank waiting for a message no rank will send, and says so."""
    verdict = code_checks.check_doubling_allreduce(waits_for_the_wrong_neighbour,
                                                   world_sizes=(4,), sizes=(12,))
    assert not verdict.passed
    assert "deadlock: rank 0 waits for a message from rank 1" in verdict.feedback


def _zero_doubling() -> object:
    """Exactly recursive doubling's sends, carrying zeros: what a sum found elsewhere needs."""
    from tests.grading.test_nbgrader_flow import ZERO_DOUBLING

    return rank_function("doubling_shaped_zeros", "ctx, tensor", ZERO_DOUBLING)


def test_doubling_shaped_sends_of_zeros_earn_nothing() -> None:
    """The relay kept what every message carried: zeros are no partial sum, so the traffic
    part fails with the sums, and the question scores 0."""
    verdict = code_checks.check_doubling_allreduce(_zero_doubling(), world_sizes=(4,),
                                                   sizes=(13,))
    assert "0 / 4 points" in verdict.feedback, verdict.feedback
    assert "is not a chunk of a sum of the ranks' tensors" in verdict.feedback


# ---- Q2: accumulation with no_sync ------------------------------------------------------------
def _window(acc, grads, micro_step, every):  # type: ignore[no-untyped-def]
    """Add ``grads`` into ``acc``; at the window's end hand back its sum and start afresh."""
    if not acc:
        acc.extend(grads)
    else:
        for a, g in zip(acc, grads):
            a += g
    if (micro_step + 1) % every:
        return None
    out = list(acc)
    acc.clear()
    return out


def sync_every_micro_step(ctx, grads, acc, micro_step, every, cap_bytes):  # type: ignore[no-untyped-def]
    """Lesson 01's sync on every micro-step: the right averages, every-fold the messages."""
    import torch

    out = [g.clone() for g in grads]
    flat = torch.cat([g.reshape(-1) for g in out])  # one bucket: also ignores the cap
    ctx.comm.all_reduce(flat)
    flat /= ctx.world_size * every
    offset = 0
    for g in out:
        g.copy_(flat[offset:offset + g.numel()])
        offset += g.numel()
    return _window(acc, out, micro_step, every)


def forgets_the_window(ctx, grads, acc, micro_step, every, cap_bytes):  # type: ignore[no-untyped-def]
    """Buckets and timing right, but the window's sum is not divided by ``every``."""
    import torch

    out = _window(acc, [g.clone() for g in grads], micro_step, every)
    if out is None:
        return None
    buckets, filled = [[]], 0
    for g in out:
        if buckets[-1] and filled + 4 * g.numel() > cap_bytes:
            buckets.append([])
            filled = 0
        buckets[-1].append(g)
        filled += 4 * g.numel()
    for bucket in buckets:
        flat = torch.cat(bucket)
        ctx.comm.all_reduce(flat)
        flat /= ctx.world_size
        offset = 0
        for g in bucket:
            g.copy_(flat[offset:offset + g.numel()])
            offset += g.numel()
    return out


def test_syncing_every_micro_step_loses_the_quiet_part_only_for_timing() -> None:
    verdict = code_checks.check_accumulate(sync_every_micro_step)
    assert "[ok] averages over ranks and micro-steps" in verdict.feedback
    assert "micro-step 0 is not a sync step but ran 1 all-reduce(s)" in verdict.feedback
    assert "[failed] one all-reduce per bucket at a sync" in verdict.feedback
    assert "1 / 3 points" in verdict.feedback


def test_an_undivided_window_loses_the_averages_with_a_hint() -> None:
    verdict = code_checks.check_accumulate(forgets_the_window, world_size=3, every=3, seed=2)
    assert "[failed] averages over ranks and micro-steps" in verdict.feedback
    assert "divide by every AND by world_size" in verdict.feedback
    assert "[ok] no communication between syncs" in verdict.feedback
    assert "[ok] one all-reduce per bucket at a sync" in verdict.feedback
    assert "2 / 3 points" in verdict.feedback


# ---- Q3: ZeRO-1 with Adam ----------------------------------------------------------------------
ZERO_PARAMS = "ctx, params, grads, state, lr, betas, eps"
"""The parameters of problem set 3's ``zero_adam_step``."""
FLAT_GRAD = """    n, rank = ctx.world_size, ctx.rank
    total = sum(p.numel() for p in params)
    shard = -(-total // n)
    pad = shard * n - total
    flat_grad = torch.cat([g.reshape(-1) for g in grads] + [grads[0].new_zeros(pad)])
"""
"""How a ZeRO-1 step starts: every gradient in one flat buffer, padded to n equal shards."""
ZERO_ADAM = FLAT_GRAD + """    {reduce}
    if "m" not in state:
        state["m"], state["v"], state["t"] = torch.zeros_like(g), torch.zeros_like(g), 0
    state["t"] += 1
    b1, b2 = betas
    state["m"].mul_(b1).add_(g, alpha=1 - b1)
    state["v"].mul_(b2).addcmul_(g, g, value=1 - b2)
    m_hat = state["m"] / (1 - b1 ** state["t"]) if {bias} else state["m"]
    v_hat = state["v"] / (1 - b2 ** state["t"]) if {bias} else state["v"]
    flat = torch.cat([p.reshape(-1) for p in params] + [params[0].new_zeros(pad)])
    mine = flat[rank * shard:(rank + 1) * shard] - lr * m_hat / (v_hat.sqrt() + eps)
    ctx.comm.all_gather(flat, mine.contiguous())
    offset = 0
    for p in params:
        p.copy_(flat[offset:offset + p.numel()].view_as(p))
        offset += p.numel()
"""
REDUCE_SCATTER = "g = flat_grad.new_empty(shard); ctx.comm.reduce_scatter(g, flat_grad); g /= n"
ALL_REDUCE = ("ctx.comm.all_reduce(flat_grad); "
              "g = flat_grad[rank * shard:(rank + 1) * shard] / n")


def zero_adam(reduce: str = REDUCE_SCATTER, bias: bool = True) -> object:
    return rank_function("zero_adam_step", ZERO_PARAMS,
                         ZERO_ADAM.format(reduce=reduce, bias=bias))


def test_zero_adam_honest_passes_on_uneven_sizes() -> None:
    verdict = code_checks.check_zero_adam(zero_adam(), world_size=4, sizes=(3, 17, 9, 2), seed=3)
    assert verdict.passed, verdict.feedback


def test_zero_adam_slips_lose_their_part_and_are_named() -> None:
    """No bias correction: the parameters match Adam without it (said so); an all-reduce
    where ZeRO reduce-scatters: right parameters, the traffic part fails with the reason."""
    no_bias = code_checks.check_zero_adam(zero_adam(bias=False))
    assert "they match Adam without bias correction" in no_bias.feedback
    assert "2 / 3 points" in no_bias.feedback
    reduced = code_checks.check_zero_adam(zero_adam(ALL_REDUCE))
    assert "[ok] parameters match Adam on the mean gradient" in reduced.feedback
    assert "ran ['all_reduce', 'all_gather']" in reduced.feedback
    assert "reduce_scatter hands each rank its shard's sum" in reduced.feedback
    assert "2 / 3 points" in reduced.feedback


def test_zero_adam_without_padding_is_told_to_pad() -> None:
    def no_padding(ctx, params, grads, state, lr, betas, eps):  # type: ignore[no-untyped-def]
        import torch

        flat = torch.cat([g.reshape(-1) for g in grads])
        ctx.comm.reduce_scatter(flat.new_empty(flat.numel() // ctx.world_size), flat)

    verdict = code_checks.check_zero_adam(no_padding)
    assert "22 values do not split into 3 equal shards" in verdict.feedback
    assert "pad the flat buffer with zeros to 24 values" in verdict.feedback
