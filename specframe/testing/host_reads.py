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
