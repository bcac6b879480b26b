"""The rank grid, the GPT and its data, and the 3D calculator, without processes."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from labkit.base.errors import ConfigError
from labkit.base.grid import Grid
from labkit.config.run import RunConfig
from labkit.theory import gpt_params, parallel_layout

pytestmark = pytest.mark.lesson09
ROOT = Path(__file__).resolve().parents[2]


def test_grid_puts_tp_fastest_and_groups_share_their_other_coordinates() -> None:
    g = Grid(dp=2, pp=2, tp=2)
    assert [(g.coords(r).dp, g.coords(r).pp, g.coords(r).tp) for r in (0, 1, 2, 7)] == [
        (0, 0, 0), (0, 0, 1), (0, 1, 0), (1, 1, 1)]
    assert g.group("tp", 5) == [4, 5] and g.group("pp", 5) == [5, 7]
    assert g.group("dp", 5) == [1, 5]
    assert g.groups("tp") == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert all(g.rank(**vars(g.coords(r))) == r for r in range(8))
    with pytest.raises(ConfigError, match=r"dp \(0\)"):
        Grid(dp=0)


def test_cp_sits_next_to_tp_and_ep_groups_consecutive_data_ranks() -> None:
    g = Grid(dp=2, cp=2, tp=2)
    assert g.world_size == 8 and g.group("cp", 5) == [5, 7] and g.group("tp", 5) == [4, 5]
    assert g.group("dp", 5) == [1, 5] and g.coords(6).cp == 1
    assert all(g.rank(**vars(g.coords(r))) == r for r in range(8))
    e = Grid(dp=4, ep=2, tp=2)
    assert e.world_size == 8 and e.group("ep", 5) == [5, 7] and e.group("ep", 1) == [1, 3]
    assert e.groups("ep") == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert e.active_axes() == ["dp", "tp", "ep"] and str(e) == "dp4 x pp1 x tp2 (ep2 over dp)"
    with pytest.raises(ConfigError, match=r"ep \(3\) must divide dp \(4\)"):
        Grid(dp=4, ep=3)


def test_gpt_param_count_matches_the_model_and_tp_slices_reassemble() -> None:
    import copy

    from labkit.train.models.gpt import build_gpt
    from labkit.train.parallel.tensor import tensor_parallel, unshard

    full = build_gpt(96, 64, 2, 4, 16, seed=0)
    assert sum(p.numel() for p in full.parameters()) == gpt_params(96, 64, 2, 16)["total"]
    shards = [tensor_parallel(copy.deepcopy(full), r, 2, None) for r in range(2)]
    layout = parallel_layout(width=64, depth=2, heads=4, seq_len=16, vocab=96, tp=2)
    assert sum(p.numel() for p in shards[0].parameters()) == layout.params_per_rank[0]
    merged = unshard([s.state_dict() for s in shards])
    assert all(torch.equal(merged[k], v) for k, v in full.state_dict().items())
    x = torch.randint(0, 96, (3, 16))
    assert full(x).shape == (3, 16, 96)


def test_layout_traffic_follows_the_formulas() -> None:
    lay = parallel_layout(width=64, depth=4, heads=4, seq_len=16, vocab=96, dp=2, pp=2, tp=2,
                          microbatches=2, batch_size=8)
    act = 4 * 16 * 64 * 4  # 4 rows per microbatch x 16 tokens x 64 wide, fp32
    assert lay.activation_bytes == act
    assert lay.traffic["pp"] == 2 * 2 * 1 * 2 * 2 * act  # dp x tp x (p-1) x M x (F + B)
    assert lay.traffic["tp"] == 2 * 2 * 4 * 2 * 4 * (2 * 1 / 2) * act
    z3 = parallel_layout(width=64, depth=4, heads=4, seq_len=16, vocab=96, dp=2, pp=2,
                         microbatches=2, batch_size=8, zero_stage=3)
    z0 = parallel_layout(width=64, depth=4, heads=4, seq_len=16, vocab=96, dp=2, pp=2,
                         microbatches=2, batch_size=8, zero_stage=0)
    assert z3.traffic["dp"] == pytest.approx(z0.traffic["dp"] * (1 + 2 * 2) / 2)
    assert z3.notes and "ZeRO-3" in z3.notes[0]


def test_text_and_digits_tasks_need_no_download() -> None:
    from labkit.train.data import DigitsTask, TextTask

    text = TextTask(0, 16)
    assert text.x.shape[1] == 16 and torch.equal(text.x[0, 1:], text.y[0, :-1])
    assert text.tokens_per_sample == 16 and int(text.x.max()) < 96
    words = TextTask(0, 16, vocab_size=512)
    assert int(words.x.max()) < 512
    digits = DigitsTask(0)
    assert digits.x.shape == (1500, 64) and digits.test_x.shape == (297, 64)
    assert set(digits.y.unique().tolist()) == set(range(10))


def test_the_digits_ship_with_labkit_with_their_licence_and_need_no_scikit_learn() -> None:
    """The data set is labkit's own file (UCI, CC BY 4.0), read without importing sklearn, and
    the package data declares it so a wheel carries it."""
    import subprocess
    import sys

    from labkit.train.data.digits import CSV

    assert CSV.is_file() and (CSV.parent / "DIGITS_LICENSE.txt").is_file()
    assert "CC BY 4.0" in (CSV.parent / "DIGITS_LICENSE.txt").read_text()
    code = ("import sys; from labkit.train.data import DigitsTask; DigitsTask(0); "
            "print('sklearn' in sys.modules, 'scipy' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"], out
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert "digits.csv.gz" in pyproject and "scikit-learn" not in pyproject


def test_model_kinds_and_defaults_resolve_before_any_process() -> None:
    cfg = RunConfig(strategy="ddp", model="gpt")
    assert cfg.model.kind == "gpt" and cfg.optimizer == "momentum" and cfg.steps == 40
    assert RunConfig(strategy="ddp").optimizer == "sgd"
    assert RunConfig(strategy="ddp", model={"kind": "digits"}).model.kind == "digits"
    assert RunConfig(strategy="hybrid", model="gpt", options={"dp": 2, "pp": 2,
                                                               "tp": 2}).world_size == 8
    with pytest.raises(ConfigError, match="world_size \\(4\\) must equal dp x pp x tp"):
        RunConfig(strategy="hybrid", model="gpt", world_size=4,
                  options={"dp": 2, "pp": 2, "tp": 2})
    with pytest.raises(ConfigError, match="needs --model gpt"):
        RunConfig(strategy="hybrid", options={"tp": 2})
    with pytest.raises(ConfigError, match="must divide heads"):
        RunConfig(strategy="hybrid", model={"kind": "gpt", "heads": 3, "width": 96},
                  options={"tp": 2})
    with pytest.raises(ConfigError, match="model.kind 'bert'"):
        RunConfig(strategy="ddp", model="bert")
    with pytest.raises(ConfigError, match="gpipe and 1f1b"):
        RunConfig(strategy="pipeline", model="gpt", options={"schedule": "zb"})
