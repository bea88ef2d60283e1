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

from specframe.decode.side_rows import Block, prefix_visibility, top_offset, tree_size
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
    def tree_forward(self, trees: Sequence[DraftTree | Block], hidden: bool = False) -> Any:
        """The tree (or a :class:`~specframe.decode.side_rows.Block`: the tree and its side rows)
        on top of the prefix; the largest position is known here, so none is read."""
        (tree,) = trees
        length = self.lengths[0]
        self._size, self.last_rows = tree_size(tree), len(tree)
        mask = tree.ancestor_mask()
        seen = prefix_visibility(tree, length, length)
        if seen is not None:  # side rows that see less than the whole prefix mask its columns
            mask = torch.cat([seen, mask], dim=1)
        # The prefix holds length = L - 1 entries; the root sits at position L - 1.
        return self.target.tree_forward(tree.tokens, tree.positions(length + 1), mask,
                                         output_hidden_states=hidden, max_position=length + top_offset(tree))

    def rows_of(self, tensor: torch.Tensor) -> list[torch.Tensor]:
        """The sequence's ``[n, ...]`` tree rows of an output of the last :meth:`tree_forward`."""
        return [tensor[0, : self._size]]

    def side_rows_of(self, tensor: torch.Tensor) -> list[torch.Tensor]:
        """The sequence's side rows (after its tree) of an output of the last :meth:`tree_forward`."""
        return [tensor[0, self._size : self.last_rows]]

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
