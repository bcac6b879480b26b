"""Problem set 3's relay and state check against a rank that writes on its own pipe or hides
its state (issue 35, item 5), on relayed ranks; honest code keeps full marks beside them.

* A rank shares its pipe to the grader with the harness, so it can write a frame of its
  own: "step end" before a hidden all-gather of whole tensors, "step begin" after it, then
  a recursive-doubling-shaped cover. The relay accepts each case's edges once, in order,
  and files what a rank sends between cases under the case it just ended.
* ZeRO-1 whose rank keeps Adam's full ``m`` and ``v`` as Python floats in a list (or a
  global) beside a shard-sized decoy: the state check counts them wherever they are.
"""

from __future__ import annotations

from typing import Any

import pytest

from labkit.grading import code_checks
from tests.distributed.test_grading_code_checks import (
    FLAT_GRAD,
    ZERO_PARAMS,
    doubling,
    everyone_sends_everything,
)
from tests.support.rank_code import rank_function

pytestmark = [pytest.mark.distributed, pytest.mark.grading, pytest.mark.lesson08]


def forged_case_edges() -> Any:
    calls = {"n": 0}

    def attack(ctx, tensor):  # type: ignore[no-untyped-def]
        case, calls["n"] = calls["n"], calls["n"] + 1
        link = ctx._link
        link.post({"op": "step", "case": case, "edge": "end"})  # off the record, it hopes
        total = tensor.clone()
        everyone_sends_everything(ctx, total)  # every rank's whole tensor: an all-gather
        link.post({"op": "step", "case": case, "edge": "begin"})
        doubling(ctx, tensor.clone())  # the cover: doubling's sends, real sums
        tensor.copy_(total)

    return attack


def test_a_rank_that_marks_its_own_case_edges_earns_nothing_and_honest_code_everything(
        ) -> None:
    attacked = code_checks.check_doubling_allreduce(forged_case_edges(), world_sizes=(4,),
                                                    sizes=(12,))
    assert not attacked.passed
    assert "broke the relay's rules" in attacked.feedback, attacked.feedback
    honest = code_checks.check_doubling_allreduce(doubling, world_sizes=(2, 4), sizes=(12, 13))
    assert honest.passed, honest.feedback


ZERO_HIDING = FLAT_GRAD + """    mine = flat_grad.new_empty(shard)
    ctx.comm.reduce_scatter(mine, flat_grad)
    full = flat_grad.new_empty(shard * n)
    ctx.comm.all_gather(full, mine)  # the whole mean gradient, one all-gather's worth
    g = full[:total] / n
    if "m" not in state:  # the decoys: a shard's m and v, as ZeRO-1 keeps
        state["m"], state["v"], state["t"] = g.new_zeros(shard), g.new_zeros(shard), 0
        {where} = [[0.0] * total, [0.0] * total]
    kept = {where}
    m, v = torch.as_tensor(kept[0], dtype=g.dtype), torch.as_tensor(kept[1], dtype=g.dtype)
    state["t"] += 1
    b1, b2 = betas
    m = b1 * m + (1 - b1) * g
    v = b2 * v + (1 - b2) * g * g
    kept[0], kept[1] = {keep}  # the full moments, kept for the next step
    step = lr * (m / (1 - b1 ** state["t"])) / ((v / (1 - b2 ** state["t"])).sqrt() + eps)
    offset = 0
    for p in params:
        p.sub_(step[offset:offset + p.numel()].view_as(p))
        offset += p.numel()
"""


@pytest.mark.parametrize(("where", "keep"), [
    ('state["hist"]', "m.tolist(), v.tolist()"),  # Python floats in a list in the state
    ("HIDDEN[0]", "m.clone(), v.clone()")])  # tensors in a global, outside the state
def test_full_moments_beside_a_shard_sized_decoy_lose_the_state_part(where: str, keep: str
                                                                     ) -> None:
    step = rank_function("zero_adam_step", ZERO_PARAMS,
                         ZERO_HIDING.replace("{where}", where).replace("{keep}", keep),
                         HIDDEN=[None])
    verdict = code_checks.check_zero_adam(step)
    assert "[ok] parameters match Adam on the mean gradient" in verdict.feedback, \
        verdict.feedback
    assert "[failed] Adam state sharded: m and v of one shard" in verdict.feedback, \
        verdict.feedback
