"""The all-reduce benchmark's settings, metrics record and registration (``labkit.strategies.collectives``).

Torch-free: discovery imports this (through the package) in the supervisor, which validates a
config and builds the CLI flags from it before any process starts; the rank code lives in the
sibling modules and is imported only inside the ranks.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from labkit.base.errors import ConfigError
from labkit.base.validate import check_fields, integer, one_of, option
from labkit.config.registry import Strategy, register

IMPLS = ("builtin", "ring", "reduce_broadcast", "all_to_all", "hierarchical")
_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9,
          "KIB": 2**10, "MIB": 2**20, "GIB": 2**30}
_SIZE_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][0-9]+)?)\s*([A-Za-z]*)\s*$")
MAX_BYTES = 2 * 10**9


def parse_size(value: Any) -> int:
    """``"4KB"`` -> 4000, ``"1MiB"`` -> 1048576, ``4096`` -> 4096 (bytes, a multiple of 4)."""
    if isinstance(value, bool):
        raise ConfigError(f"size {value!r} must be a byte count or a size string; e.g. '4MB' or 4096")
    if isinstance(value, (int, float)):
        number, unit = float(value), ""
    else:
        m = _SIZE_RE.match(str(value))
        if m is None or m.group(2).upper() not in _UNITS:
            raise ConfigError(f"size {value!r} must be a number of bytes with an optional unit "
                              f"B, KB, MB, GB, KiB, MiB or GiB; e.g. '4KB', '1MB' or 4096")
        number, unit = float(m.group(1)), m.group(2).upper()
    size = round(number * _UNITS[unit])
    if size < 4 or size > MAX_BYTES:
        raise ConfigError(f"size {value!r} ({size} bytes) must be between 4 bytes (one fp32 "
                          f"value) and {MAX_BYTES} bytes; e.g. '4MB'")
    if size % 4:
        raise ConfigError(f"size {value!r} ({size} bytes) must be a multiple of 4 bytes (whole "
                          f"fp32 values); e.g. {size - size % 4 or 4}")
    return size


def format_size(size: int) -> str:
    """4000 -> '4KB', 4000000 -> '4MB' (decimal units, as parsed by ``parse_size``)."""
    for unit, scale in (("GB", 10**9), ("MB", 10**6), ("KB", 10**3)):
        if size >= scale and size % scale == 0:
            return f"{size // scale}{unit}"
    return f"{size}B"


@dataclass(kw_only=True, frozen=True)
class AllreduceBenchOptions:
    """Settings of the all-reduce benchmark."""

    impl: str = option("builtin", one_of(IMPLS, example="ring"))
    """ring (ours, on send/recv), builtin (the backend's all_reduce), reduce_broadcast,
    all_to_all, or hierarchical (reduce-scatter inside each node, all-reduce across nodes,
    all-gather inside; node size from the run: ``--nodes``, or torchrun's local ranks)."""
    sizes: tuple[str, ...] = ("4KB", "64KB", "1MB", "4MB")
    """Message sizes: bytes or with a unit (4KB, 1MB, 1MiB); each a multiple of 4 bytes."""
    iters: int = option(10, integer(1, 10_000, example=10))
    """Timed all-reduces per size (the mean is reported)."""
    warmup: int = option(2, integer(0, 1000, example=2))
    """Untimed all-reduces per size before timing (connection set-up, caches)."""

    def __post_init__(self) -> None:
        problems = check_fields(self)
        raw = (self.sizes,) if isinstance(self.sizes, (str, int, float)) else tuple(self.sizes)
        parsed: list[int] = []
        for s in raw:
            try:
                parsed.append(parse_size(s))
            except ConfigError as err:
                problems += err.problems
        if not raw:
            problems.append("sizes () must name at least one size; e.g. --sizes 4KB 1MB 4MB")
        if problems:
            raise ConfigError(problems)
        object.__setattr__(self, "sizes", tuple(parsed))

    @property
    def sizes_bytes(self) -> tuple[int, ...]:
        return tuple(int(s) for s in self.sizes)


register(Strategy(
    name="allreduce-bench", entry="labkit.strategies.collectives.bench:train",
    options=AllreduceBenchOptions,
    summary="time all-reduce per size (ours: ring / naive, or built-in): algbw, busbw, alpha-beta fit",
    lesson="01_data_parallelism"))
