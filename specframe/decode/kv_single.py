"""The one-sequence KV layout: the target's own cache, with the batch layouts' interface.

The decode step (:meth:`specframe.decode.engine.SpecDecoder._step`) runs over a KV layout; for one
sequence it is this one. Nothing is padded, the tree goes through
:meth:`TargetModel.tree_forward` (so a target that pre-allocates, compiles or replays a trace
serves it), the largest position is known on the host, and keeping a contiguous accepted path
is a crop, not a gather: the B = 1 fast path lives here, not in a second loop.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from specframe.models.target import TargetModel
from specframe.tree import DraftTree


class SingleKV:
    """One live sequence on :class:`TargetModel`'s cache (see the module docstring).

    ``reserve``: positions past the prompt the sequence may take (new tokens plus one tree);
    a target that pre-allocates sizes its cache for the prompt plus that.
    """

    layout = "single"

    def __init__(self, target: TargetModel, reserve: int = 128) -> None:
        self.target = target
        self.reserve = int(reserve)
        self.lengths: list[int] = [0]
        self.last_rows = 0
        self._size = 0

    @property
    def width(self) -> int:
        """Cache entries before the next tree (the committed prefix)."""
        return self.lengths[0]

    def prefill(self, prefixes: Sequence[torch.Tensor], hidden: bool = False, logits: bool = False) -> Any:
        """Start the sequence on ``prefixes[0]`` (its prompt without the root); returns the
        model output (logits only where asked) or None for a one-token prompt."""
        if len(prefixes) != 1:
            raise ValueError(f"the one-sequence layout takes one prompt, got {len(prefixes)}")
        prefix = prefixes[0]
        n = int(prefix.numel())
        self.target.reset(capacity=n + 1 + self.reserve)  # used if the target pre-allocates
        self.lengths = [n]
        if n == 0:
            return None
        return self.target.causal_forward(prefix.to(self.target.device), hidden, last_logits_only=not logits)

    def join(self, prefixes: Sequence[torch.Tensor], hidden: bool = False, logits: bool = False) -> Any:
        """A second sequence does not fit this layout (a batch layout does)."""
        raise ValueError("the one-sequence layout cannot take more sequences: use a batch layout")

    @torch.inference_mode()
    def tree_forward(self, trees: Sequence[DraftTree], hidden: bool = False) -> Any:
        """The tree on top of the prefix; the largest position is known here, so none is read."""
        (tree,) = trees
        length, n = self.lengths[0], len(tree)
        self._size, self.last_rows = n, n
        # The prefix holds length = L - 1 entries; the root sits at position L - 1.
        return self.target.tree_forward(tree.tokens, tree.positions(length + 1), tree.ancestor_mask(),
                                         output_hidden_states=hidden, max_position=length + n - 1)

    def rows_of(self, tensor: torch.Tensor) -> list[torch.Tensor]:
        """The sequence's ``[n, ...]`` rows of an output of the last :meth:`tree_forward`."""
        return [tensor[0, : self._size]]

    def hidden_rows(self, out: Any) -> list[Any]:
        """The forward's hidden states as the drafter takes them (``[1, n, H]`` per layer)."""
        return [out.hidden_states]

    def keep(self, paths: Sequence[torch.Tensor | None], tree_start: int,
             contiguous: Sequence[bool] | None = None) -> None:
        """Keep the accepted path (a crop when ``contiguous``); None: the sequence finished."""
        (path,) = paths
        if path is not None:
            self.target.keep(self.lengths[0], path, contiguous=None if contiguous is None else contiguous[0])
            self.lengths = [self.lengths[0] + int(path.numel())]
