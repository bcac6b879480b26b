"""``labkit.lessons.mechanism.compare``: a lesson's hand-written mechanism beside labkit's
result, in words -- equal to the tolerance, or the first rank / key / element where they part."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from labkit.lessons.mechanism import MATCH, MISMATCH, compare


def test_equal_per_rank_tensors_match_and_count_their_values():
    mine = [torch.arange(7.0), torch.arange(7.0)]
    c = compare(mine, [t.clone() for t in mine], what="ring all-reduce", per_rank=True)
    assert c and MATCH in str(c) and c.values == 14 and c.max_abs_diff == 0.0


def test_a_wrong_element_names_the_rank_the_index_and_both_values():
    ref = [np.zeros(5), np.arange(5.0)]
    mine = [np.zeros(5), np.array([0.0, 1.0, 2.0, 30.0, 4.0])]
    c = compare(mine, ref, what="sum", per_rank=True)
    assert not c and MISMATCH in str(c)
    assert "rank 1[3]: yours 30, labkit's 3" in str(c), str(c)
    assert c.max_abs_diff == 27.0


def test_tolerance_admits_rounding_but_not_more():
    assert compare(1.0 + 1e-9, 1.0, what="x", atol=1e-6)
    assert not compare(1.0 + 1e-3, 1.0, what="x", atol=1e-6)
    assert "tolerance 1e-06" in str(compare(1.0, 1.0, what="x", atol=1e-6))


def test_shapes_keys_lengths_and_strings_part_in_words():
    assert "shape (3,), labkit's (4,)" in str(compare(np.zeros(3), np.zeros(4), what="g"))
    c = compare({"a": 1}, {"a": 1, "b": 2}, what="state")
    assert not c and "labkit's has ['a', 'b']" in str(c)
    assert "3 items, labkit's 2" in str(compare([1, 2, 3], [1, 2], what="list"))
    c = compare({"sha": "ab12"}, {"sha": "ab13"}, what="params_sha256")
    assert not c and "['sha']: yours 'ab12', labkit's 'ab13'" in str(c)


def test_nan_never_matches():
    assert not compare(float("nan"), 1.0, what="loss", atol=1.0)
    assert not compare(np.array([np.nan]), np.array([1.0]), what="loss", atol=1.0)


def test_a_negative_tolerance_is_refused_with_the_rule():
    with pytest.raises(ValueError, match="atol=-1 and rtol=0 must be >= 0"):
        compare(1, 1, what="x", atol=-1)
