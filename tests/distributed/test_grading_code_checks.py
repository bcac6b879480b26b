"""Code checks on real ranks: a correct-but-wasteful ring and a direct dist call both fail."""

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

    all_reduce(tensor)  # bypasses ctx.comm: no event on the timeline, but the spy sees it


def test_naive_exchange_fails_on_bytes_with_the_numbers() -> None:
    verdict = code_checks.check_ring_allreduce(everyone_sends_everything, world_sizes=(3,),
                                               sizes=(13,))
    assert not verdict.passed
    assert "[208, 208, 208] B" in verdict.feedback  # 2 x 13 float64 per rank
    assert "2(n-1)/n" in verdict.feedback


def test_direct_torch_distributed_call_is_detected() -> None:
    verdict = code_checks.check_ring_allreduce(calls_torch_directly, world_sizes=(2,), sizes=(12,))
    assert not verdict.passed
    assert "built-in collective(s) ['allreduce']" in verdict.feedback


def test_expected_buckets_greedy_rule() -> None:
    assert code_checks.expected_buckets([4000, 40, 1200, 20000, 28, 8000, 2400], 8000) == [
        [0, 1, 2], [3], [4], [5], [6]]
