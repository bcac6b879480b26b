"""Tensor-parallel byte formulas and option rules (no processes)."""

from __future__ import annotations

import pytest

from labkit.base.errors import ConfigError
from labkit.config.run import RunConfig
from labkit.strategies.tp import TPOptions
from labkit.strategies.tp.cost import tp_allreduces_per_layer, tp_bytes_per_layer

pytestmark = pytest.mark.lesson04


def test_one_allreduce_per_column_row_pair_each_way() -> None:
    """Megatron: attention + MLP = 2 all-reduces forward and 2 backward; one block = 1 + 1."""
    assert tp_allreduces_per_layer("both") == {"forward": 2, "backward": 2}
    assert tp_allreduces_per_layer("mlp") == {"forward": 1, "backward": 1}
    assert tp_allreduces_per_layer("attention") == {"forward": 1, "backward": 1}


def test_bytes_per_layer_is_count_times_bsh_times_value_size() -> None:
    """Each all-reduce carries one (b, s, h) activation: 8*16*256*4 B = 131072 B."""
    got = tp_bytes_per_layer(8, 16, 256, "both", 4, world_size=4)
    assert got["forward"] == 2 * 131072 and got["backward"] == 2 * 131072
    assert got["total"] == 4 * 131072
    assert got["wire_per_rank"] == pytest.approx(2 * 3 / 4 * 4 * 131072)


def test_bad_block_and_shapes_are_rejected_with_the_value() -> None:
    with pytest.raises(ConfigError, match=r"block \('conv'\) must be one of both, mlp, attention"):
        TPOptions(block="conv")
    with pytest.raises(ConfigError, match=r"hidden \(100\) must be a multiple of heads \(8\)"):
        TPOptions(hidden=100)


def test_heads_must_split_over_ranks_before_any_process_starts() -> None:
    with pytest.raises(ConfigError, match=r"heads \(6\) must be a multiple of world_size \(4\)"):
        RunConfig(strategy="tp", world_size=4, options={"heads": 6, "hidden": 96})
    RunConfig(strategy="tp", world_size=4, options={"heads": 8})


def test_tp_help_lists_every_flag_and_heads_reaches_its_blocks(capsys) -> None:
    """`labkit run tp --help` works (tp's ``heads`` shares the common ``--heads`` flag) and
    ``--heads`` sets the heads of the blocks tp trains."""
    from labkit.cli import build_parser, main
    from labkit.config.flags import config_from_args

    assert main(["run", "tp", "--help"]) == 0
    shown = capsys.readouterr().out
    assert "--hidden" in shown and "--heads" in shown and "--block" in shown
    args, extra = build_parser().parse_known_args(["run", "tp", "--heads", "4", "--hidden", "64"])
    config = config_from_args(args, extra)
    assert config.options.heads == 4 and config.options.hidden == 64
