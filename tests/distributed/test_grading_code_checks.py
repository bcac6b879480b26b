"""Code checks on relayed ranks: a wasteful ring, a direct dist call, a collective and a
deadlock all fail with feedback that says why; honest code passes, and each rank only ever
sees its own inputs."""

from __future__ import annotations

import pytest

from labkit.grading import code_checks

pytestmark = [pytest.mark.distributed, pytest.mark.grading, pytest.mark.lesson08]


def everyone_sends_everything(ctx, tensor):  # type: ignore[no-untyped-def]
    """Right sums, wrong traffic: (n-1) x the tensor per rank instead of 2(n-1)/n."""
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


def test_naive_exchange_fails_on_bytes_with_the_numbers() -> None:
    verdict = code_checks.check_ring_allreduce(everyone_sends_everything, world_sizes=(3,),
                                               sizes=(13,))
    assert not verdict.passed
    assert "[208, 208, 208] B" in verdict.feedback  # 2 x 13 float64 per rank
    assert "2(n-1)/n" in verdict.feedback


def test_an_honest_ring_passes_every_part() -> None:
    verdict = code_checks.check_ring_allreduce(ring, world_sizes=(3,), sizes=(12, 13))
    assert verdict.passed, verdict.feedback


def test_direct_torch_distributed_call_finds_no_process_group() -> None:
    """Ranks of a relayed exercise have no process group: dist.all_reduce has no one to
    talk to, and the feedback says where the messages must go instead."""
    verdict = code_checks.check_ring_allreduce(calls_torch_directly, world_sizes=(2,), sizes=(12,))
    assert not verdict.passed
    assert "Default process group has not been initialized" in verdict.feedback
    assert "no process group: they talk only through ctx.comm" in verdict.feedback


def test_a_collective_through_ctx_comm_fails_the_gate() -> None:
    verdict = code_checks.check_ring_allreduce(calls_a_collective, world_sizes=(2,), sizes=(12,))
    assert not verdict.passed
    assert "used built-in collective(s) ['all_reduce']" in verdict.feedback
    assert "0 / 4 points" in verdict.feedback


def test_a_deadlock_is_named_at_once_not_timed_out() -> None:
    """The relay sees every rank waiting for a message no rank will send, and says so."""
    verdict = code_checks.check_ring_allreduce(waits_for_the_wrong_neighbour, world_sizes=(3,),
                                               sizes=(12,))
    assert not verdict.passed
    assert "deadlock: rank 0 waits for a message from rank 1" in verdict.feedback


def test_expected_buckets_greedy_rule() -> None:
    assert code_checks.expected_buckets([4000, 40, 1200, 20000, 28, 8000, 2400], 8000) == [
        [0, 1, 2], [3], [4], [5], [6]]


def _zero_ring() -> object:
    """Exactly a ring's sends, carrying zeros: what a sum found some other way would need."""
    import torch

    from tests.grading.test_nbgrader_flow import ZERO_RING

    namespace = {"torch": torch}
    exec("def ring_shaped_zeros(ctx, tensor):\n" + ZERO_RING, namespace)
    return namespace["ring_shaped_zeros"]


def test_ring_shaped_sends_of_zeros_earn_nothing() -> None:
    """The relay kept what every message carried: zeros are no chunk of any partial sum,
    so the bytes part fails with the sums, and the question scores 0."""
    verdict = code_checks.check_ring_allreduce(_zero_ring(), world_sizes=(3,), sizes=(13,))
    assert "0 / 4 points" in verdict.feedback, verdict.feedback
    assert "is not a chunk of a sum of the ranks' tensors" in verdict.feedback
