"""Draw docs/img/batching-packed.png and batching-flat.png: three sequences' trees in one
verification forward, padded to ``[B, n_max]`` and concatenated into one row of real nodes.

The masks are the ones the engine builds (:func:`specframe.decode.kv_padded.packed_visibility`,
:func:`specframe.decode.kv_flat.flat_visibility`), for rows holding 6, 3 and 4 committed entries
(a padded cache of 6 columns; flat segments of 7)::

    python docs/img/make_batching_figure.py
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402

from specframe.decode.kv_flat import flat_visibility  # noqa: E402
from specframe.decode.kv_padded import packed_visibility  # noqa: E402
from specframe.tree import DraftTree  # noqa: E402

OUT = Path(__file__).resolve().parent / "batching-packed.png"
FLAT = OUT.with_name("batching-flat.png")
SEGMENT = 7
LENGTHS = [6, 3, 4]
WIDTH = 6


def tree(layers: list[list[int]]) -> DraftTree:
    """A tree from its layers' parent indices (tokens and probabilities do not matter here)."""
    t = DraftTree.root(0)
    for parents in layers:
        p = torch.tensor(parents)
        t = t.add_nodes(p, torch.arange(len(parents)) + 1, torch.full((len(parents),), -1.0))
    return t


TREES = [[[0, 0], [1, 1, 2]], [[0]], [[0, 0, 0], [1]]]


def draw_flat() -> None:
    """Render the flat mask: every tree's nodes in one row of queries, the segments side by side."""
    trees = [tree(t) for t in TREES]
    width = SEGMENT * len(trees)
    visible = flat_visibility(LENGTHS, [b * SEGMENT for b in range(len(trees))], width, trees).float()
    shade = visible.clone()
    at = 0
    for b, t in enumerate(trees):
        # This row's own stale segment columns, orange; the other rows' segments stay pale (never seen).
        shade[at : at + len(t), b * SEGMENT + LENGTHS[b] : (b + 1) * SEGMENT] = -0.4
        at += len(t)
    fig, ax = plt.subplots(figsize=(12, 4.2))
    ax.imshow(shade, cmap="RdYlGn", vmin=-1, vmax=1)
    at = 0
    for b, t in enumerate(trees):
        ax.axvline((b + 1) * SEGMENT - 0.5, color="black", lw=1.5 if b == len(trees) - 1 else 0.8)
        if b:
            ax.axhline(at - 0.5, color="grey", lw=1, ls="--")
        at += len(t)
    ax.set_xticks(range(visible.shape[1]), [f"s{j // SEGMENT}.{j % SEGMENT}" for j in range(width)]
                  + [f"t{i}" for i in range(visible.shape[0])], fontsize=6, rotation=90)
    ax.set_yticks(range(visible.shape[0]), [f"seq {b} node {i}" for b, t in enumerate(trees) for i in range(len(t))],
                  fontsize=7)
    ax.set_xlabel("keys: segments of the batch cache (one per sequence) | the concatenated trees")
    ax.set_title("Flat layout: the trees' real nodes in one row, no padding; green = visible, "
                 "orange = stale columns of the node's own segment", fontsize=10)
    fig.tight_layout()
    fig.savefig(FLAT, dpi=110)
    print(f"wrote {FLAT}")


def main() -> None:
    """Render the packed mask of three trees, one panel per sequence, then the flat one."""
    trees = [tree(t) for t in TREES]
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
    draw_flat()


if __name__ == "__main__":
    main()
