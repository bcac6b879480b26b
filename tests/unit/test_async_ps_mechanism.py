"""Lesson 11's mechanism check: the hash of a flat weight vector is the hash labkit reports
for the same model, and the one-process reference is flat in the order the server keeps."""

from __future__ import annotations

import pytest

from labkit.lessons import async_ps_mechanism as mech
from labkit.train.reference import params_sha256, reference_run


@pytest.fixture(scope="module")
def flat():
    return mech.one_process_weights()


def test_a_flat_vector_hashes_like_the_state_dict_it_came_from(flat):
    """``weights_sha256`` of the one-process weights, flattened in ``parameters()`` order,
    equals ``params_sha256`` of that process's own state dict (what ``finish_run`` hashes),
    as a tensor and as a read-only numpy array (what a Ray actor returns)."""
    state = reference_run(mech.MECHANISM_RUN, dp=mech.workers()).state
    assert flat.numel() == mech.model_params() == 22_026
    assert mech.weights_sha256(flat) == params_sha256(state.items())
    frozen = flat.numpy().copy()
    frozen.setflags(write=False)
    assert mech.weights_sha256(frozen) == params_sha256(state.items())


def test_one_changed_weight_changes_the_hash_and_a_short_vector_is_refused(flat):
    moved = flat.clone()
    moved[-1] += 1e-6
    assert mech.weights_sha256(moved) != mech.weights_sha256(flat)
    with pytest.raises(ValueError, match="22025 numbers, the model 22026"):
        mech.weights_sha256(flat[:-1])


def test_the_tolerance_is_the_labs_rounding_rule_for_sgd():
    """4e-5 for 10 steps of SGD at lr 0.4 (``labkit.theory.rounding``)."""
    assert pytest.approx(1e-5 * 0.4 * 10) == mech.TOLERANCE
