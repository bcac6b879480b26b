"""Tensor parallelism (lesson 04).

``labkit run tp --world-size N`` trains a small stack of transformer-style blocks
(multi-head attention, then an MLP, each with a residual) where every weight matrix is split
across the N ranks the Megatron-LM way (Shoeybi et al. 2019): the first linear of each pair
is column-parallel, the second row-parallel, so each block needs exactly one all-reduce in
forward and one in backward.

The options, metrics record and registration live in ``options`` (torch-free); this package
re-exports them.
"""

from labkit.strategies.tp.options import BLOCKS, TPMetrics, TPOptions, check

__all__ = ["BLOCKS", "TPMetrics", "TPOptions", "check"]
