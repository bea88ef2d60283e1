"""Draw docs/img/batching-packed.png: three sequences' trees packed into one verification forward.

The mask is the one the engine builds (:func:`specframe.batch_kv.packed_visibility`), for a
ragged batch cache of 6 columns whose rows hold 6, 3 and 4 committed entries::

    python docs/img/make_batching_figure.py
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402

from specframe.batch_kv import packed_visibility  # noqa: E402
from specframe.tree import DraftTree  # noqa: E402

OUT = Path(__file__).resolve().parent / "batching-packed.png"
LENGTHS = [6, 3, 4]
WIDTH = 6


def tree(layers: list[list[int]]) -> DraftTree:
    """A tree from its layers' parent indices (tokens and probabilities do not matter here)."""
    t = DraftTree.root(0)
    for parents in layers:
        p = torch.tensor(parents)
        t = t.add_nodes(p, torch.arange(len(parents)) + 1, torch.full((len(parents),), -1.0))
    return t


def main() -> None:
    """Render the packed mask of three trees, one panel per sequence."""
    trees = [tree([[0, 0], [1, 1, 2]]), tree([[0]]), tree([[0, 0, 0], [1]])]
    visible = packed_visibility(LENGTHS, WIDTH, trees).float()
    n_max = visible.shape[1]
    fig, axes = plt.subplots(1, len(trees), figsize=(12, 3.6), sharey=True)
    for b, ax in enumerate(axes):
        shade = visible[b].clone()
        shade[:, LENGTHS[b]:WIDTH] = -0.4  # stale cache columns of this row
        shade[len(trees[b]):, WIDTH:] *= 0.5  # padding nodes (see only themselves)
        ax.imshow(shade, cmap="RdYlGn", vmin=-1, vmax=1)
        ax.axvline(WIDTH - 0.5, color="black", lw=1.5)
        ax.axhline(len(trees[b]) - 0.5, color="grey", lw=1, ls="--")
        ax.set_title(f"sequence {b}: {LENGTHS[b]} committed, tree of {len(trees[b])}")
        ax.set_xticks(range(WIDTH + n_max),
                      [f"c{j}" for j in range(WIDTH)] + [f"t{i}" for i in range(n_max)], fontsize=7)
        ax.set_yticks(range(n_max), [f"node {i}" for i in range(n_max)], fontsize=7)
        ax.set_xlabel("keys: batch cache columns | packed tree columns")
    axes[0].set_ylabel("queries (tree nodes, padded to n_max)")
    fig.suptitle("One verification forward: green = visible, orange = stale cache column, "
                 "below the dashed line = padding", fontsize=10)
    fig.tight_layout()
    fig.savefig(OUT, dpi=110)
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
