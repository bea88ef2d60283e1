"""Hypothesis strategies that generate valid random draft trees (reusable by third parties)."""

from __future__ import annotations

import torch
from hypothesis import strategies as st

from specframe.search_space import Dimension
from specframe.tree import DraftTree


@st.composite
def draft_trees(draw, max_nodes: int = 64, vocab_size: int = 64, max_children: int | None = None) -> DraftTree:
    """A valid DraftTree with 1..max_nodes nodes: random shape, distinct sibling tokens,
    cumulative log-probs that never increase along a path."""
    n = draw(st.integers(1, max_nodes))
    parents, tokens, logp, ranks = [-1], [draw(st.integers(0, vocab_size - 1))], [0.0], [-1]
    used: dict[int, set[int]] = {0: set()}
    for i in range(1, n):
        open_nodes = [p for p in range(i) if len(used[p]) < min(vocab_size, max_children or vocab_size)]
        if not open_nodes:
            break
        p = draw(st.sampled_from(open_nodes))
        tok = draw(st.integers(0, vocab_size - 1).filter(lambda t, p=p: t not in used[p]))
        used[p].add(tok)
        used[i] = set()
        parents.append(p)
        tokens.append(tok)
        logp.append(logp[p] - draw(st.floats(0.0, 5.0, allow_nan=False)))
        ranks.append(len(used[p]) - 1)
    depths = [0]
    for i in range(1, len(parents)):
        depths.append(depths[parents[i]] + 1)
    return DraftTree(
        tokens=torch.tensor(tokens), parents=torch.tensor(parents), depths=torch.tensor(depths),
        logp=torch.tensor(logp, dtype=torch.float32), ranks=torch.tensor(ranks),
    )


@st.composite
def maybe_broken_trees(draw, fields: tuple[str, ...] = ("parents", "depths", "tokens", "logp"),
                       max_nodes: int = 24) -> DraftTree:
    """Valid trees, and trees with one invariant of ``fields`` broken at a random node (a parent
    out of order, a depth off by up to two, a sibling's token repeated, a non-finite or other
    log-prob): what a tree's validity checks must tell apart."""
    tree = draw(draft_trees(max_nodes=max_nodes))
    n = len(tree)
    field = draw(st.sampled_from(("none",) + tuple(fields)))
    i = draw(st.integers(0, n - 1))
    t = {k: getattr(tree, k).clone() for k in ("tokens", "parents", "depths", "logp", "ranks")}
    if field == "parents":
        t["parents"][i] = draw(st.integers(-1, n))
    elif field == "depths":
        t["depths"][i] += draw(st.integers(-2, 2))
    elif field == "tokens" and i > 0:
        siblings = (t["parents"] == t["parents"][i]).nonzero().flatten().tolist()
        t["tokens"][i] = t["tokens"][draw(st.sampled_from(siblings))]
    elif field == "logp":
        t["logp"][i] = draw(st.sampled_from([float("nan"), float("inf"), -float("inf"), -1.0]))
    return DraftTree(**t)


def prompts(vocab_size: int = 64, min_len: int = 1, max_len: int = 64):
    """Prompt token-id lists (ids 2.. so that the tiny models' bos/eos ids stay special)."""
    return st.lists(st.integers(2, vocab_size - 1), min_size=min_len, max_size=max_len)


def dimension_values(dim: Dimension):
    """Values of one declared search dimension (:mod:`specframe.search_space`): its choices, or
    its range (ends included; an int range on its step)."""
    if dim.kind == "choice":
        return st.sampled_from(dim.choices)
    if dim.kind == "int":
        low, high = int(dim.low), int(dim.high)
        return st.integers(0, (high - low) // dim.step).map(lambda k: low + k * dim.step)
    return st.floats(float(dim.low), float(dim.high), allow_nan=False, allow_infinity=False)


@st.composite
def search_points(draw, options_cls: type, base: dict | None = None) -> dict:
    """One point of the search space ``options_cls`` declares: ``{option: value}`` for every
    dimension whose conditions hold (read from the point, else ``base``)."""
    from specframe.search_space import draw_point, search_space

    return draw_point(search_space(options_cls), lambda dim: draw(dimension_values(dim), label=dim.name), base)
