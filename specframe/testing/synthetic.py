"""A model-free drafter for testing and benchmarking tree policies without any target model.

:class:`SyntheticDrafter` returns, for every tree node, a ``[V]`` log-probability row that is a
pure function of the node's path tokens (root token first), so identical trees always get
identical distributions and a policy can be checked for determinism, shape behaviour and
invariants in milliseconds. Rows come from one of:

* a built-in generator (``mode``): ``random`` (Gaussian logits divided by ``temperature``:
  low temperature = confident, high = flat), ``one_hot`` (one token with probability 1, all
  others ``-inf``), ``ties`` (integer-valued logits, so many exact ties, and now and then a
  "spike" row whose best token has log-prob exactly 0 and thus ties its parent's cumulative
  score);
* a callable ``source(path) -> [V]`` of logits or log-probs;
* a table: a mapping ``{path: row}`` or a ``[M, V]`` tensor indexed by a hash of the path;
* :meth:`SyntheticDrafter.fixed`: pre-computed ``[L, M, V]`` rows served as views by depth
  (no per-call work at all, for timing policies only).

Rows are normalised with ``log_softmax`` (a no-op on log-probs up to rounding), except in
``fixed`` mode where the table is served as given. Typical use::

    drafter = SyntheticDrafter(vocab_size=128, temperature=0.5, seed=3)
    tree = policy.build(make_session(drafter), budget=60)
"""

from __future__ import annotations

import hashlib
import struct
from typing import Any, Callable, Mapping, Sequence

import torch

from specframe.interfaces import DraftSession, Drafter
from specframe.tree import DraftTree

#: Built-in row generators.
MODES: tuple[str, ...] = ("random", "one_hot", "ties")

Path = tuple[int, ...]
Source = Callable[[Path], torch.Tensor] | Mapping[Path, Any] | torch.Tensor


class SyntheticDrafter(Drafter):
    """Deterministic draft distributions keyed by node path; no target model needed.

    Args:
        vocab_size: V, the length of every row.
        source: optional callable / mapping / ``[M, V]`` tensor giving rows (see module doc);
            when None, rows come from ``mode``.
        mode: ``random``, ``one_hot`` or ``ties`` (ignored when ``source`` is given).
        temperature: divides the ``random`` logits: < 1 sharpens, > 1 flattens.
        seed: mixed into every row's hash, so different seeds give different drafters.
        levels: number of distinct integer logit values in ``ties`` mode (fewer = more ties).
        spike_rate: fraction of ``ties`` rows whose best token gets log-prob exactly 0.
        dtype: dtype of the returned rows.

    Attributes:
        calls: number of rows requested by each ``expand`` call, in order (one entry per
            draft forward), for tests that count forwards or batch sizes.
    """

    name = "synthetic"

    def __init__(
        self,
        vocab_size: int,
        source: Source | None = None,
        *,
        mode: str = "random",
        temperature: float = 1.0,
        seed: int = 0,
        levels: int = 3,
        spike_rate: float = 0.3,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        super().__init__(options=None, target=None)  # type: ignore[arg-type]
        if vocab_size < 1:
            raise ValueError(f"vocab_size must be >= 1, got {vocab_size}")
        if source is None and mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        if temperature <= 0:
            raise ValueError(f"temperature must be > 0, got {temperature}")
        self._vocab_size = int(vocab_size)
        self.source = source
        self.mode = mode
        self.temperature = float(temperature)
        self.seed = int(seed)
        self.levels = max(1, int(levels))
        self.spike_rate = float(spike_rate)
        self.dtype = dtype
        self.calls: list[int] = []
        self._fixed: torch.Tensor | None = None
        self._cache: dict[Path, torch.Tensor] = {}

    # ------------------------------------------------------------------ constructors
    @classmethod
    def fixed(cls, table: torch.Tensor) -> "SyntheticDrafter":
        """Serve pre-computed log-prob rows: nodes at depth d get ``table[min(d, L-1), :rows]``.

        ``table`` is ``[L, M, V]``; a call for more than M nodes wraps around the M rows. The
        rows are returned as views (no copy, no normalisation), so the drafter costs nothing
        and a benchmark times only the policy. Not path-deterministic: siblings share rows.
        """
        if table.dim() != 3:
            raise ValueError(f"table must be [layers, rows, V], got shape {tuple(table.shape)}")
        drafter = cls(int(table.shape[-1]), dtype=table.dtype)
        drafter._fixed = table
        return drafter

    def clone(self) -> "SyntheticDrafter":
        """A fresh drafter with the same configuration (same rows, empty ``calls``)."""
        other = SyntheticDrafter(
            self._vocab_size, self.source, mode=self.mode, temperature=self.temperature,
            seed=self.seed, levels=self.levels, spike_rate=self.spike_rate, dtype=self.dtype,
        )
        other._fixed = self._fixed
        return other

    def __repr__(self) -> str:
        kind = "fixed" if self._fixed is not None else ("source" if self.source is not None else self.mode)
        return (f"SyntheticDrafter(V={self._vocab_size}, kind={kind}, temperature={self.temperature}, "
                f"seed={self.seed})")

    # ------------------------------------------------------------------ Drafter API
    @property
    def vocab_size(self) -> int:
        """V, fixed at construction (no target needed)."""
        return self._vocab_size

    def expand(self, tree: DraftTree, nodes: torch.Tensor) -> torch.Tensor:
        """Rows ``[len(nodes), V]`` for the given nodes of ``tree`` (one 'forward')."""
        nodes = torch.as_tensor(nodes, dtype=torch.long)
        if len(nodes) and (int(nodes.min()) < 0 or int(nodes.max()) >= len(tree)):
            raise IndexError(f"expand(): nodes {nodes.tolist()} outside a tree of {len(tree)} nodes")
        self.calls.append(len(nodes))
        if self._fixed is not None:
            return self._fixed_rows(tree, nodes)
        if not len(nodes):
            return torch.empty(0, self._vocab_size, dtype=self.dtype)
        return torch.stack([self.row(p) for p in paths_of(tree, nodes)])

    def row(self, path: Sequence[int]) -> torch.Tensor:
        """The ``[V]`` log-prob row after ``path`` (root token first): a pure function of it."""
        path = tuple(int(t) for t in path)
        if path not in self._cache:
            self._cache[path] = self._make_row(path)
        return self._cache[path]

    # ------------------------------------------------------------------ internals
    def _fixed_rows(self, tree: DraftTree, nodes: torch.Tensor) -> torch.Tensor:
        assert self._fixed is not None
        n_layers, n_rows, _ = self._fixed.shape
        depth = min(int(tree.depths[nodes[0]]) if len(nodes) else 0, n_layers - 1)
        if len(nodes) <= n_rows:
            return self._fixed[depth, : len(nodes)]
        return self._fixed[depth, torch.arange(len(nodes)) % n_rows]

    def _generator(self, path: Path) -> torch.Generator:
        raw = struct.pack(f"<{len(path) + 1}q", self.seed, *path)
        digest = hashlib.blake2b(raw, digest_size=8).digest()
        return torch.Generator().manual_seed(int.from_bytes(digest, "little") & (2**63 - 1))

    def _make_row(self, path: Path) -> torch.Tensor:
        if self.source is not None:
            logits = self._from_source(path)
        else:
            logits = {"random": self._random, "one_hot": self._one_hot, "ties": self._ties}[self.mode](path)
        logits = torch.as_tensor(logits).to(torch.float64).flatten()
        if logits.shape != (self._vocab_size,):
            raise ValueError(f"row for path {path} has shape {tuple(logits.shape)}, expected ({self._vocab_size},)")
        return torch.log_softmax(logits, dim=-1).to(self.dtype)

    def _from_source(self, path: Path) -> Any:
        src = self.source
        if isinstance(src, torch.Tensor):
            digest = hashlib.blake2b(struct.pack(f"<{len(path) + 1}q", self.seed, *path), digest_size=8).digest()
            return src[int.from_bytes(digest, "little") % src.shape[0]]
        if isinstance(src, Mapping):
            if path not in src:
                raise KeyError(f"synthetic table has no row for path {path}")
            return src[path]
        return src(path)

    def _random(self, path: Path) -> torch.Tensor:
        gen = self._generator(path)
        return torch.randn(self._vocab_size, generator=gen, dtype=torch.float64) / self.temperature

    def _one_hot(self, path: Path) -> torch.Tensor:
        gen = self._generator(path)
        row = torch.full((self._vocab_size,), -torch.inf, dtype=torch.float64)
        row[int(torch.randint(self._vocab_size, (1,), generator=gen))] = 0.0
        return row

    def _ties(self, path: Path) -> torch.Tensor:
        gen = self._generator(path)
        row = torch.randint(self.levels, (self._vocab_size,), generator=gen).to(torch.float64)
        if float(torch.rand(1, generator=gen, dtype=torch.float64)) < self.spike_rate:
            # Far above the rest: log_softmax gives exactly 0, so the child ties its parent.
            row[int(torch.randint(self._vocab_size, (1,), generator=gen))] = 1000.0
        return row


def paths_of(tree: DraftTree, nodes: torch.Tensor | Sequence[int]) -> list[Path]:
    """Token paths (root token first) of ``nodes`` in ``tree``."""
    tokens, parents = tree.tokens.tolist(), tree.parents.tolist()
    out = []
    for node in torch.as_tensor(nodes).tolist():
        path = []
        while node >= 0:
            path.append(tokens[node])
            node = parents[node]
        out.append(tuple(reversed(path)))
    return out


def make_session(
    drafter: Drafter, root_token: int = 0, device: torch.device | str = "cpu",
    generator: torch.Generator | None = None,
) -> DraftSession:
    """A :class:`DraftSession` for one tree rooted at ``root_token`` (counts draft forwards).

    ``generator`` is handed to policies that sample children (when the session supports it).
    """
    if generator is None:
        return DraftSession(drafter, root_token, torch.device(device))
    return DraftSession(drafter, root_token, torch.device(device), generator=generator)


def synthetic_drafters(max_vocab: int = 256, modes: Sequence[str] = MODES, min_vocab: int = 2):
    """Hypothesis strategy of random :class:`SyntheticDrafter` s (V in [min_vocab, max_vocab]).

    Temperatures span confident (0.05) to flat (20); ``ties`` drafters use 1-4 logit levels.
    """
    from hypothesis import strategies as st

    return st.builds(
        SyntheticDrafter,
        vocab_size=st.integers(min_vocab, max_vocab),
        mode=st.sampled_from(tuple(modes)),
        temperature=st.sampled_from((0.05, 0.2, 0.5, 1.0, 2.0, 5.0, 20.0)),
        seed=st.integers(0, 2**31 - 1),
        levels=st.integers(1, 4),
    )
