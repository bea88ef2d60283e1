"""Count the operations that make the host wait for the device (on a GPU, a synchronisation).

Works on CPU, where nothing actually waits, so tests can pin how often a code path *would*
synchronise on a GPU. Counted: reading values (``item``, ``tolist``, ``bool``/``int``/
``float``/``index`` conversion, ``cpu``, ``numpy``) and ops whose output shape depends on the
data (``nonzero``, ``unique``, ``bincount``, ``masked_select``, indexing with a bool mask).
"""

from __future__ import annotations

from collections import Counter
from contextlib import contextmanager
from typing import Any, Iterator

import torch
from torch.overrides import TorchFunctionMode

_READS = {"item", "tolist", "__bool__", "__int__", "__float__", "__index__", "cpu", "numpy",
          "nonzero", "unique", "bincount", "masked_select", "argwhere"}


def _bool_mask_index(args: tuple) -> bool:
    index = args[1] if len(args) > 1 else None
    items = index if isinstance(index, tuple) else (index,)
    return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in items)


class HostReadCounter(TorchFunctionMode):
    """A torch function mode tallying host reads by operation name; see the module docstring.

    ``with counter.paused():`` excludes a region (e.g. a plugin's own work).
    """

    def __init__(self) -> None:
        super().__init__()
        self.counts: Counter[str] = Counter()
        self._paused = 0

    @property
    def total(self) -> int:
        """All counted reads."""
        return sum(self.counts.values())

    @contextmanager
    def paused(self) -> Iterator[None]:
        """Do not count inside this block."""
        self._paused += 1
        try:
            yield
        finally:
            self._paused -= 1

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: Any = None) -> Any:
        name = getattr(func, "__name__", "")
        if not self._paused and (name in _READS or (name == "__getitem__" and _bool_mask_index(args))):
            self.counts[name] += 1
        return func(*args, **(kwargs or {}))


def _counted(fn: Any, counter: HostReadCounter, hidden_from: HostReadCounter | None = None) -> Any:
    """``fn`` counted by ``counter`` (and, if given, not by ``hidden_from``)."""
    def run(*args: Any, **kwargs: Any) -> Any:
        if hidden_from is None:
            with counter:
                return fn(*args, **kwargs)
        with hidden_from.paused(), counter:
            return fn(*args, **kwargs)
    return run


def count_step_reads(decoder: Any, prompt: list[int], max_new_tokens: int) -> dict[str, float]:
    """Generate once and return the host reads made over all steps: ``policy``
    (``policy.build``, the drafter's ``expand`` included), ``commit`` (``drafter.commit`` and
    ``drafter.side_rows``) and
    ``engine`` (the rest of the step, verifier included), plus ``steps`` and ``delta``.
    Patches ``decoder``'s instances in place."""
    engine, build, commit = HostReadCounter(), HostReadCounter(), HostReadCounter()
    decoder.policy.build = _counted(decoder.policy.build, build, engine)
    decoder.drafter.commit = _counted(decoder.drafter.commit, commit, engine)
    # Side rows are the drafter's host data: its hook counts as its own, like commit.
    decoder.drafter.side_rows = _counted(decoder.drafter.side_rows, commit, engine)
    decoder._step = _counted(decoder._step, engine)
    out = decoder.generate(prompt, max_new_tokens=max_new_tokens, eos_token_id=None)
    return {"steps": len(out.steps), "delta": out.delta, "policy": build.total, "commit": commit.total,
            "engine": engine.total}
