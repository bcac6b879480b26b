"""Text every machine has offline: the source of Python's own standard library.

A language model needs text, and labkit may not download any. Every Python installation
carries its standard library as source, so a fixed list of those files (``FILES``) is the
corpus: about 490 kB of real, structured text (Python code, docstrings, comments). On one
machine it is identical for every rank and every run; another Python version has slightly
different files, so losses differ a little between machines (say so when comparing).

Tokens: by default characters (``CHARS``, 96 symbols: newline and printable ASCII; anything
else becomes "?"). With ``vocab_size`` = V, the V - 1 most frequent word pieces (identifiers,
numbers, runs of spaces, single symbols) plus one "unknown" token: a vocabulary large
enough for the embedding and the head to weigh as much as a transformer block, as they do
in real models (GPT-2: 38 M of 124 M parameters).

Samples are consecutive windows of ``seq_len + 1`` tokens: ``x`` the first ``seq_len``, ``y``
the same shifted by one (next-token prediction).
"""

from __future__ import annotations

import collections
import functools
import re
import sysconfig
from pathlib import Path

import torch

from labkit.train.data.base import Task

FILES = ("argparse.py", "textwrap.py", "string.py", "functools.py", "dataclasses.py",
         "heapq.py", "bisect.py", "fractions.py", "statistics.py", "collections/__init__.py",
         "shutil.py", "pathlib.py")
CHARS = "\n" + "".join(chr(c) for c in range(32, 127))
_PIECE = re.compile(r"[A-Za-z_]+|\d+| +|\n|.")


@functools.cache
def corpus() -> str:
    """The concatenated standard-library files (read once per process)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    return "\n".join((root / name).read_text(encoding="utf-8", errors="replace")
                     for name in FILES)


@functools.cache
def vocabulary(vocab_size: int | None) -> tuple[str, ...]:
    """The token strings: characters, or the most frequent word pieces (+ "<unk>" first)."""
    if vocab_size is None:
        return tuple(CHARS)
    counts = collections.Counter(_PIECE.findall(corpus()))
    common = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:vocab_size - 1]
    return ("<unk>", *(piece for piece, _ in common))


@functools.cache
def tokens(vocab_size: int | None) -> torch.Tensor:
    """The whole corpus as token ids (int64), on the CPU (the data is made there whatever the
    default device; the loop moves each batch to the rank's device)."""
    vocab = vocabulary(vocab_size)
    index = {t: i for i, t in enumerate(vocab)}
    if vocab_size is None:
        unknown = index["?"]
        ids = [index.get(ch, unknown) for ch in corpus()]
    else:
        ids = [index.get(piece, 0) for piece in _PIECE.findall(corpus())]
    return torch.tensor(ids, dtype=torch.int64, device="cpu")


def vocab_size_of(vocab_size: int | None) -> int:
    return len(CHARS) if vocab_size is None else int(vocab_size)


class TextTask(Task):
    """Next-token prediction on the standard-library corpus, ``seq_len`` tokens per sample."""

    def __init__(self, seed: int, seq_len: int, vocab_size: int | None = None):
        ids = tokens(vocab_size)
        n = (ids.numel() - 1) // seq_len
        starts = torch.arange(n, device="cpu") * seq_len
        window = starts[:, None] + torch.arange(seq_len + 1, device="cpu")
        chunks = ids[window]
        self.x, self.y = chunks[:, :-1].contiguous(), chunks[:, 1:].contiguous()
        self.seed = seed
        self.vocab = vocabulary(vocab_size)

    def decode(self, ids: list[int]) -> str:
        """Token ids back to text (for showing what the model writes)."""
        return "".join(self.vocab[i] if self.vocab[i] != "<unk>" else "?" for i in ids)
