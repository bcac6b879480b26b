"""Mixture of experts on paper: capacity, dropped tokens, all-to-all bytes, parameters.

Follows the Switch Transformer (Fedus et al. 2021, "Switch Transformers: Scaling to Trillion
Parameter Models with Simple and Efficient Sparsity") and GShard (Lepikhin et al. 2020):

* **capacity**: each expert takes at most ``ceil(capacity_factor x tokens x k / experts)``
  token assignments of a routing group (Switch eq. 3, with top-k's k assignments per token);
  the assignments past it are *dropped* (the token rides the residual connection alone);
* **load balance**: ``tokens_per_expert``' max over its mean (1 when perfectly balanced), and
  the auxiliary loss ``experts x sum_i f_i P_i`` (Switch eq. 4) that pushes towards it;
* **expert parallelism**: experts split over ``ep`` ranks (``experts / ep`` each, rank ``r``
  holding experts ``r*E/ep ... (r+1)*E/ep - 1``); a token goes to the rank that owns its
  expert and back, two all-to-alls (dispatch, combine), whose bytes follow from the routing:
  rank ``src`` sends ``tokens[src][dst] x hidden x bytes_per_element`` to rank ``dst``;
* **parameters**: an MoE layer holds ``experts`` MLPs and a router, but each token only
  runs ``k`` of them: total parameters grow with ``experts``, active ones with ``k``.

Byte convention: *wire* bytes leave a rank for another one; the traced ``Comm`` records an
all-to-all's *payload* (its whole input, the rows a rank keeps for itself included), which
``include_self=True`` gives.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from labkit.base.errors import ConfigError
from labkit.theory.batch import check_int, check_number


def expert_capacity(tokens: int, experts: int, capacity_factor: float, top_k: int = 1) -> int:
    """Token assignments one expert takes from a routing group of ``tokens`` tokens:
    ``ceil(capacity_factor x tokens x top_k / experts)`` (Switch eq. 3; GShard's 2 tokens
    per expert for k = 2). ``expert_capacity(64, 8, 1.0) == 8``, ``expert_capacity(64, 8, 1.25) == 10``."""
    check_int("tokens", tokens, 0, "tokens=64")
    check_int("experts", experts, 1, "experts=8")
    check_int("top_k", top_k, 1, "top_k=2")
    check_number("capacity_factor", capacity_factor, "capacity_factor=1.25", allow_equal=False)
    if top_k > experts:
        raise ConfigError(f"top_k ({top_k}) must be <= experts ({experts}); e.g. top_k=2, "
                          "experts=8")
    # round first so 1.25 * 64 * 1 / 8 = 10.000000000000002 does not become 11
    return math.ceil(round(capacity_factor * tokens * top_k / experts, 9))


def kept_per_expert(counts: Sequence[int], cap: int) -> list[int]:
    """Assignments each expert runs when ``counts[i]`` were routed to it: ``min(c_i, cap)``."""
    return [min(int(c), cap) for c in counts]


def dropped_tokens(counts: Sequence[int], cap: int) -> int:
    """Assignments dropped for a count vector: ``sum_i max(0, c_i - cap)`` (with k = 1, the
    tokens that skip the layer). ``dropped_tokens([12, 4, 8, 8], 8) == 4``."""
    return sum(max(0, int(c) - cap) for c in counts)


def load_imbalance(counts: Sequence[int]) -> float:
    """The busiest expert's load over the mean load: 1.0 when balanced, ``experts`` when one
    expert gets everything (0.0 for no tokens at all)."""
    total = sum(counts)
    return max(counts) * len(counts) / total if total else 0.0


def switch_aux_loss(fractions: Sequence[float], probs: Sequence[float]) -> float:
    """Switch's load-balancing loss (eq. 4, without its coefficient alpha):
    ``experts x sum_i f_i P_i``, with ``f_i`` the share of assignments routed to expert i and
    ``P_i`` the router's mean probability for it; 1.0 at uniform routing, ``experts`` when
    every token goes to one expert with certainty."""
    if len(fractions) != len(probs):
        raise ConfigError(f"fractions ({len(fractions)}) and probs ({len(probs)}) must have one "
                          "entry per expert; e.g. [0.5, 0.5] and [0.5, 0.5]")
    return len(fractions) * sum(f * p for f, p in zip(fractions, probs))


def owner_of(expert: int, experts: int, ep: int) -> int:
    """The expert-parallel rank holding ``expert`` (contiguous blocks of ``experts / ep``)."""
    if experts % ep:
        raise ConfigError(f"experts ({experts}) must be a multiple of ep ({ep}); e.g. experts=8, "
                          "ep=4")
    return expert // (experts // ep)


def tokens_between_ranks(kept: Sequence[Sequence[int]], ep: int) -> list[list[int]]:
    """``send[src][dst]``: token rows rank ``src`` dispatches to rank ``dst``, from
    ``kept[src][i]``, the assignments rank ``src`` keeps for expert ``i`` after its capacity
    (one row per kept assignment: a top-2 token may travel twice)."""
    if len(kept) != ep:
        raise ConfigError(f"kept has {len(kept)} rows, one per rank is needed (ep={ep})")
    send = [[0] * ep for _ in range(ep)]
    for src, row in enumerate(kept):
        for i, c in enumerate(row):
            send[src][owner_of(i, len(row), ep)] += int(c)
    return send


def dispatch_bytes(send: Sequence[Sequence[int]], hidden: int, bytes_per_element: int = 4, *,
                   include_self: bool = False) -> list[int]:
    """Bytes each rank sends in the dispatch all-to-all: ``sum_dst send[src][dst] x hidden x
    bytes_per_element`` over the other ranks (``include_self``: the payload the trace
    records, the rows a rank keeps too)."""
    return [sum(n for dst, n in enumerate(row) if include_self or dst != src)
            * hidden * bytes_per_element for src, row in enumerate(send)]


def combine_bytes(send: Sequence[Sequence[int]], hidden: int, bytes_per_element: int = 4, *,
                  include_self: bool = False) -> list[int]:
    """Bytes each rank sends in the combine all-to-all: every row it received in the dispatch
    goes back, ``sum_src send[src][dst] x hidden x bytes_per_element`` for rank ``dst``.
    Backward sends the same bytes again, in the opposite direction of each forward one."""
    transposed = [list(col) for col in zip(*send)]
    return dispatch_bytes(transposed, hidden, bytes_per_element, include_self=include_self)


def counts_bytes(experts: int, bytes_per_count: int = 8) -> int:
    """Bytes of the all-to-all that precedes the dispatch: each rank sends its kept count for
    every expert (int64), so each owner learns how many rows will arrive."""
    return experts * bytes_per_count


def mlp_params(width: int, inner: int) -> int:
    """One GELU MLP (the lab's GPT block's): ``Linear(h, inner)`` and ``Linear(inner, h)`` with
    biases: ``2 h inner + inner + h``."""
    return 2 * width * inner + inner + width


def moe_params(width: int, inner: int, experts: int) -> int:
    """An MoE layer: ``experts`` MLPs and the router (``Linear(h, experts)``, no bias)."""
    return experts * mlp_params(width, inner) + width * experts


def active_params_per_token(width: int, inner: int, experts: int, top_k: int = 1) -> int:
    """Parameters one token's forward touches: the router and its ``top_k`` experts (Switch
    with k = 1 costs one MLP's FLOPs per token whatever ``experts`` is)."""
    return top_k * mlp_params(width, inner) + width * experts


def expert_parallel_traffic(kept: Sequence[int], hidden: int, experts: int, calls: int,
                            bytes_per_element: int = 4, bytes_per_count: int = 8) -> float:
    """Bytes the ranks of the ep groups send in a training step, as labkit's trace counts them
    (an all-to-all's payload is its whole input, the rows a rank keeps for itself included).

    ``kept[r]``: the assignments rank r's routers kept that step (every MoE call summed;
    ``tokens x top_k`` when nothing is dropped); ``calls``: MoE forwards per rank (layers x
    microbatches). Per call, each rank sends its counts (``experts`` int64), the rows it keeps
    (dispatch) and the rows it received (combine); backward sends both row sets again. Over
    a group the rows received add up to the rows kept, so the sum is
    ``ranks x calls x experts x 8 + 2 x 2 x hidden x bytes_per_element x sum(kept)``."""
    h = check_int("hidden", hidden, 1, "hidden=128")
    e = check_int("experts", experts, 1, "experts=8")
    n = check_int("calls", calls, 0, "calls=4")
    rows = sum(check_int(f"kept[{r}]", k, 0, "kept=[64, 64]") for r, k in enumerate(kept))
    return float(len(kept) * n * e * bytes_per_count + 4 * h * bytes_per_element * rows)
