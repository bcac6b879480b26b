"""Problem set 3's checks, without processes: the formulas they grade against and the
verdicts they give on recorded traffic.

* recursive doubling (Thakur, Rabenseifner and Gropp 2005, section 4.4): ``log2(p)`` steps,
  partner ``rank ^ 2^k``, ``n lg p`` bytes per rank, against the ring's ``2(p-1)/p n``;
* DDP's bucket rule and ``no_sync`` window (Li et al. 2020);
* Adam (Kingma and Ba 2015) as torch implements it, on ZeRO's padded flat buffer;
* the instructor's hidden cases keep the properties the questions need.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from labkit.grading import code_checks, instructor, sync_checks, zero_checks
from labkit.grading.sandbox.relay import Record
from labkit.grading.sandbox.relay_rank import pack
from labkit.theory import ring_allreduce_bytes

pytestmark = [pytest.mark.grading, pytest.mark.lesson08]
REPO = Path(__file__).resolve().parents[2]


def test_doubling_cost_is_thakurs_lg_p_steps_of_the_whole_vector() -> None:
    """lg p messages of n bytes per rank: as many bytes as the ring on 2 ranks, more after."""
    size = 8000
    assert [code_checks.doubling_steps(p) for p in (1, 2, 4, 8, 16)] == [0, 1, 2, 3, 4]
    assert code_checks.doubling_bytes(2, size) == ring_allreduce_bytes(size, 2) == size
    assert code_checks.doubling_bytes(4, size) == 2 * size > ring_allreduce_bytes(size, 4)
    assert code_checks.doubling_bytes(8, size) == 3 * size
    for bad in (0, 3, 6, 12):
        with pytest.raises(ValueError, match="power-of-two world size"):
            code_checks.doubling_steps(bad)


@pytest.mark.parametrize("world_size", [2, 4, 8])
def test_doubling_partners_pair_up_and_leave_every_rank_with_the_total(world_size: int) -> None:
    """In each step partners are mutual, and exchanging sets of ranks step by step ends
    with every rank holding all of them: the algorithm the check expects is correct."""
    held = [{r} for r in range(world_size)]
    partners = [code_checks.doubling_partners(r, world_size) for r in range(world_size)]
    for k in range(code_checks.doubling_steps(world_size)):
        assert all(partners[partners[r][k]][k] == r for r in range(world_size))
        held = [held[r] | held[partners[r][k]] for r in range(world_size)]
        assert all(len(h) == 2 ** (k + 1) for h in held)
    assert all(h == set(range(world_size)) for h in held)


def _record(sends: dict[int, list[tuple[int, torch.Tensor]]]) -> Record:
    record = Record()
    for rank, messages in sends.items():
        for peer, tensor in messages:
            record.add_send(rank, 0, peer, tensor.numel() * 8, pack(tensor))
    return record


def _doubling_record(tensors: list[torch.Tensor]) -> Record:
    """What honest recursive doubling sends: step k, the partial sum of a 2^k block."""
    n, partial = len(tensors), [t.clone() for t in tensors]
    sends: dict[int, list[tuple[int, torch.Tensor]]] = {r: [] for r in range(n)}
    for k in range(code_checks.doubling_steps(n)):
        for r in range(n):
            sends[r].append((r ^ (1 << k), partial[r].clone()))
        partial = [partial[r] + partial[r ^ (1 << k)] for r in range(n)]
    return _record(sends)


def test_doubling_traffic_passes_and_the_rings_is_named() -> None:
    tensors = [torch.randn(12, dtype=torch.float64, generator=torch.Generator().manual_seed(r))
               for r in range(4)]
    honest = _doubling_record(tensors)
    assert code_checks._doubling_traffic("f", honest, 4, 0, 96).passed
    assert code_checks._carries_data("f", honest, tensors, 0).passed
    ring = _record({r: [((r + 1) % 4, torch.zeros(3, dtype=torch.float64))] * 6
                    for r in range(4)})
    verdict = code_checks._doubling_traffic("f", ring, 4, 0, 96)
    assert not verdict.passed and "that is lesson 01's ring" in verdict.feedback
    assert "2 x 96 = 192 B per rank" in verdict.feedback


def test_doubling_traffic_with_the_wrong_partners_says_which() -> None:
    """Right bytes and messages, but rank r swaps with r+1 and r+2: not rank ^ 2^k."""
    sends = {r: [((r + 1) % 4, torch.zeros(12, dtype=torch.float64)),
                 ((r + 2) % 4, torch.zeros(12, dtype=torch.float64))] for r in range(4)}
    verdict = code_checks._doubling_traffic("f", _record(sends), 4, 0, 96)
    assert not verdict.passed
    assert "partner rank ^ 2**k, i.e. [[1, 2], [0, 3], [0, 3], [1, 2]]" in verdict.feedback


def test_zeros_in_doubling_shaped_messages_carry_no_data() -> None:
    tensors = [torch.randn(5, dtype=torch.float64) for _ in range(2)]
    zeros = _record({0: [(1, torch.zeros(5, dtype=torch.float64))],
                     1: [(0, torch.zeros(5, dtype=torch.float64))]})
    verdict = code_checks._carries_data("f", zeros, tensors, 0)
    assert not verdict.passed and "is not a chunk of a sum" in verdict.feedback


def test_expected_buckets_greedy_rule() -> None:
    assert code_checks.expected_buckets([4000, 40, 1200, 20000, 28, 8000, 2400], 8000) == [
        [0, 1, 2], [3], [4], [5], [6]]


def test_a_window_of_every_micro_steps_syncs_on_its_last() -> None:
    assert [s for s in range(8) if sync_checks.is_sync_step(s, 4)] == [3, 7]
    assert [s for s in range(4) if sync_checks.is_sync_step(s, 1)] == [0, 1, 2, 3]


@pytest.mark.parametrize("bias_correction", [True, False])
def test_adam_reference_is_torchs_adam(bias_correction: bool) -> None:
    """The grader's Adam is torch.optim.Adam (with bias correction); without it the slip the
    feedback names moves the parameters measurably further."""
    start = torch.randn(11, dtype=torch.float64)
    grads = [1e-3 * torch.randn(11, dtype=torch.float64) for _ in range(3)]
    ref = zero_checks.adam_reference(start, grads, 0.01, (0.9, 0.999), 1e-8, bias_correction)
    p = start.clone().requires_grad_(True)
    opt = torch.optim.Adam([p], lr=0.01, betas=(0.9, 0.999), eps=1e-8)
    for g in grads:
        p.grad = g.clone()
        opt.step()
    gap = float((ref - p.detach()).abs().max())
    assert gap < 1e-12 if bias_correction else gap > 1e-3


def test_adam_on_the_sum_differs_from_the_mean_beyond_the_tolerance() -> None:
    """Adam is nearly scale-free, so summing instead of averaging shows only through eps:
    with gradients of 1e-3 (as the check draws them) that is far above its 1e-9."""
    start = torch.randn(11, dtype=torch.float64)
    grads = [zero_checks.GRAD_SCALE * torch.randn(11, dtype=torch.float64) for _ in range(3)]
    args = (zero_checks.LR, zero_checks.BETAS, zero_checks.EPS)
    mean = zero_checks.adam_reference(start, grads, *args)
    summed = zero_checks.adam_reference(start, [3 * g for g in grads], *args)
    assert float((mean - summed).abs().max()) > 1e-8


def test_padded_size_rounds_up_to_the_world_size() -> None:
    assert [zero_checks.padded_size(n, 3) for n in (21, 22, 23, 24)] == [21, 24, 24, 24]
    assert zero_checks.padded_size(sum(zero_checks.ZERO_SIZES), 3) == 24  # the visible case


def test_hidden_cases_need_what_the_questions_teach() -> None:
    """Per student: the ZeRO model needs padding on its world size, the window is longer
    than the visible one, the doubling sizes include one 4 divides and two odd ones."""
    keys = instructor.load("ps3_build_it", REPO)
    assert keys is not None
    for student in (f"student{i}" for i in range(40)):
        assert sum(keys.zero_sizes(student)) % keys.ZERO_WORLD_SIZE != 0
        assert keys.accumulate_every(student) > sync_checks.EVERY
        even, small, large = keys.doubling_sizes(student)
        assert even % 4 == 0 and small % 2 == 1 and large % 2 == 1
    assert all(code_checks.doubling_steps(n) for n in keys.DOUBLING_WORLD_SIZES)
    assert len({keys.zero_sizes(s) for s in ("a", "b", "c")}) == 3


def test_state_values_find_what_a_rank_hides_beside_its_shard() -> None:
    """A shard's m and v and a step count are 2 x 8 + 1 values; the same plus a full-sized
    moment hidden as a view's storage, deep in lists, in an object or as floats is more."""
    import types

    from labkit.grading.rank_side import live_storages, state_values

    def values(make: Any) -> int:
        before = live_storages()
        state = make()
        return state_values(state, before)

    def shard() -> dict[str, Any]:
        return {"m": torch.zeros(8, dtype=torch.float64),
                "v": torch.zeros(8, dtype=torch.float64), "t": 1}

    assert values(shard) == 17
    def view() -> dict[str, Any]:  # a shard-sized view that keeps a full-sized storage
        return {**shard(), "m": torch.zeros(24, dtype=torch.float64)[:8]}

    assert values(view) == 8 + 24 + 1
    assert values(lambda: {**shard(), "x": [[[[[[torch.zeros(22)]]]]]]}) == 17 + 22
    assert values(lambda: {**shard(), "x": [0.5] * 22}) == 17 + 22
    assert values(lambda: {**shard(), "x": types.SimpleNamespace(a=torch.zeros(22))}) == 39
    assert values(lambda: {**shard(), "x": torch.zeros(22, dtype=torch.float64).numpy()
                           .tobytes()}) == 39
    hidden: list[Any] = []
    assert values(lambda: (hidden.append(torch.zeros(22)), shard())[1]) == 39  # a global
    assert values(lambda: {**shard(), "x": [[i] for i in range(20_000)]}) == -1  # too many


def test_the_relay_takes_each_case_edge_once_in_order_and_bills_the_gap() -> None:
    """The harness marks case 0, 1, ... once each; a rank writing its own "end" then
    "begin" breaks the rules, and what it sends between cases is billed to the last one."""
    from labkit.grading.sandbox.relay import Relay

    relay = Relay([object(), object()], deadline=0.0)  # type: ignore[list-item]
    rank = relay.ranks[0]
    relay._step(rank, 0, True)
    relay._step(rank, 0, False)  # a forged end: the rank is between cases now
    relay.record.add_send(0, relay._charged(rank), 1, 96, pack(torch.zeros(12)))
    assert relay.record.sent_bytes == {(0, 0): 96}
    with pytest.raises(ValueError, match="case 0 begun again"):
        relay._step(rank, 0, True)
    with pytest.raises(ValueError, match="ended while case None is open"):
        relay._step(rank, 0, False)
    relay._step(rank, 1, True)
    with pytest.raises(ValueError, match="inside case 1"):
        relay._step(rank, 2, True)
    early = relay.ranks[1]  # sends before its first case: that case takes them over
    relay.record.add_send(1, relay._charged(early), 0, 8, pack(torch.zeros(1)))
    relay._step(early, 0, True)
    assert relay.record.sent_bytes[(1, 0)] == 8 and (1, None) not in relay.record.sent_bytes
