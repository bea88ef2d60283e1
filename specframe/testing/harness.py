"""Building blocks of the conformance properties: references, checks and an engine-like step.

Everything here is plain code a plugin author can reuse in their own tests; the conformance
classes (:mod:`specframe.testing.conformance`) are built from it.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from specframe.interfaces import DraftSession, Drafter
from specframe.models.target import TargetModel
from specframe.tree import DRAFTING_MODES, DraftTree

from specframe.testing.synthetic import SyntheticDrafter, paths_of


def greedy_reference(model: Any, prompt: list[int], max_new_tokens: int, eos: int | None) -> list[int]:
    """``model.generate(do_sample=False)``: the tokens every greedy combination must reproduce.

    Without EOS, ``min_new_tokens`` keeps transformers from stopping at the config's EOS id.
    """
    ids = torch.tensor([prompt])
    stop = dict(eos_token_id=eos, pad_token_id=eos) if eos is not None else dict(min_new_tokens=max_new_tokens)
    out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                         max_new_tokens=max_new_tokens, **stop)
    return out[0, len(prompt):].tolist()


def greedy_by_recomputation(model: Any, prompt: list[int], max_new_tokens: int, eos: int | None) -> list[int]:
    """Plain greedy decoding by full recomputation, each token the argmax of a forward over
    everything so far. Unlike :func:`greedy_reference` it never masks the config's EOS id, which
    a run without EOS (``eos`` None) may emit as an ordinary token."""
    ids, out = list(prompt), []
    with torch.inference_mode():
        while len(out) < max_new_tokens:
            tok = int(model(torch.tensor([ids])).logits[0, -1].argmax())
            ids.append(tok)
            out.append(tok)
            if tok == eos:
                break
    return out


def check_output(out: Any, expected: list[int], max_new: int, eos: int | None, label: str) -> None:
    """A generation equals greedy decoding and honours max_new_tokens / EOS exactly."""
    assert out.tokens == expected, f"{label}: speculative output differs from model.generate(do_sample=False)"
    assert len(out.tokens) <= max_new
    assert sum(s.emitted for s in out.steps) == len(out.tokens), f"{label}: step records miss tokens"
    if eos is not None:
        assert out.stopped_at_eos == (eos in out.tokens), f"{label}: EOS {eos} not honoured"


def check_against_drafter(tree: DraftTree, drafter: SyntheticDrafter, strict_ranks: bool = False) -> None:
    """Every drafted node is a real, finite child of its parent with the right score and rank."""
    paths = paths_of(tree, range(len(tree)))
    logp = tree.logp.double()
    for i in range(1, len(tree)):
        parent, token = int(tree.parents[i]), int(tree.tokens[i])
        row = drafter.row(paths[parent]).double()
        value = float(row[token])
        assert math.isfinite(value), f"node {i} (token {token}) has a -inf draft log-prob: an impossible node"
        assert abs(float(logp[i]) - (float(logp[parent]) + value)) <= 1e-4 * (1 + abs(float(logp[i]))), (
            f"node {i}: cumulative log-prob {float(logp[i])} != parent {float(logp[parent])} + {value}"
        )
        # Rank among the parent's candidates: higher log-prob first, lower token id on ties
        # (-1 is the tree's "unknown", e.g. for sampled children).
        rank = int((row > value).sum()) + int((row[:token] == value).sum())
        allowed = (rank,) if strict_ranks else (rank, -1)
        assert int(tree.ranks[i]) in allowed, f"node {i}: rank {int(tree.ranks[i])}, expected {rank}"


def check_draft_records(tree: DraftTree, vocab_size: int) -> None:
    """A tree of sampled children says how they were drawn and carries the distributions."""
    assert tree.drafting in DRAFTING_MODES, f"tree.drafting {tree.drafting!r} is not one of {DRAFTING_MODES}"
    if tree.drafting == "deterministic":
        return
    q = tree.draft_probs
    assert q is not None, f"tree.drafting is {tree.drafting!r} but tree.draft_probs is None"
    assert tuple(q.shape) == (len(tree), vocab_size), f"draft_probs shape {tuple(q.shape)}"
    expanded = torch.unique(tree.parents[1:])
    sums = q[expanded].double().sum(dim=-1)
    assert torch.allclose(sums, torch.ones_like(sums), atol=1e-6), "a draft_probs row of an expanded node does not sum to 1"
    assert bool((q[tree.parents[1:], tree.tokens[1:]] > 0).all()), "a sampled child has draft probability 0"


def sparse_drafter(vocab: int, finite: int, seed: int) -> SyntheticDrafter:
    """Rows with only ``finite`` finite entries (the rest -inf), like n-gram or reduced-vocab drafters."""
    base = SyntheticDrafter(vocab, temperature=0.5, seed=seed, dtype=torch.float64)

    def row(path: tuple[int, ...]) -> torch.Tensor:
        logits = base.row(path)
        keep = torch.topk(logits, min(finite, vocab)).indices
        out = torch.full_like(logits, -math.inf)
        out[keep] = logits[keep]
        return out

    return SyntheticDrafter(vocab, row, seed=seed)


def needs_target_logits(drafter: Drafter) -> bool:
    """Whether ``drafter`` declares ``needs_target_logits`` (on its class or the instance)."""
    return bool(getattr(drafter, "needs_target_logits", False))


def learns_from_verdicts(drafter: Drafter) -> bool:
    """Whether ``drafter``'s drafts depend on the verdicts at its rejected nodes too: it declares
    ``learns_from_verdicts`` or ``needs_target_logits`` (on its class or the instance)."""
    return bool(getattr(drafter, "learns_from_verdicts", False)) or needs_target_logits(drafter)


def begin_generation(drafter: Drafter, target: TargetModel, committed: list[int]) -> None:
    """Start a generation as the engine does: prefill the target, then ``begin`` with the
    target's hidden states and logits for drafters that declare they need them."""
    prompt = torch.tensor(committed, dtype=torch.long)
    needs_hidden = bool(getattr(drafter, "needs_target_hidden", False))
    target.reset()
    hidden = logits = None
    if len(committed) > 1:  # the root enters the target's cache with the first tree
        prefill = target.causal_forward(prompt[:-1].to(target.device), needs_hidden)
        hidden = prefill.hidden_states if needs_hidden else None
        # What the engine passes: the prompt's logits unless the drafter declines them.
        logits = prefill.logits[0] if getattr(drafter, "needs_prompt_logits", True) else None
    if needs_target_logits(drafter):
        drafter.begin(prompt, target_hidden=hidden, target_logits=logits)
    else:
        drafter.begin(prompt, target_hidden=hidden)


def commit_step(drafter: Drafter, emitted: list[int], path: torch.Tensor, tree: DraftTree,
                target_out: Any) -> None:
    """Commit a verified step with the arguments the engine passes: the emitted tokens (long),
    the accepted path (long, root first), the target's hidden states of the tree (drafters
    with ``needs_target_hidden``, else None), ``tree=`` the verified tree and, for drafters
    that declare ``needs_target_logits``, ``target_logits=`` the ``[len(tree), V]`` logits the
    verifier saw. ``target_out`` is the tree forward's output."""
    hidden = target_out.hidden_states if getattr(drafter, "needs_target_hidden", False) else None
    tokens = torch.tensor(emitted, dtype=torch.long)
    path = torch.as_tensor(path, dtype=torch.long, device=tree.device)
    if needs_target_logits(drafter):
        drafter.commit(tokens, path, hidden, tree=tree, target_logits=target_out.logits[0])
    else:
        drafter.commit(tokens, path, hidden, tree=tree)


def grow_tree(session: DraftSession, widths: list[int]) -> tuple[DraftTree, dict[int, torch.Tensor]]:
    """A tree of one expanded layer per entry of ``widths`` (top-w finite children per node)."""
    tree, frontier, rows = session.new_tree(), [0], {}
    for width in widths:
        logp = session.expand(tree, frontier)
        rows.update({node: logp[j] for j, node in enumerate(frontier)})
        top = torch.topk(logp.double(), min(width, logp.shape[-1]), dim=-1)
        keep = torch.isfinite(top.values)
        if not bool(keep.any()):
            break
        flat = keep.flatten()
        parents = torch.tensor(frontier, dtype=torch.long).repeat_interleave(top.values.shape[1])[flat]
        start = len(tree)
        logp_nodes = tree.logp[parents].double() + top.values.flatten()[flat]
        tree = tree.add_nodes(parents, top.indices.flatten()[flat], logp_nodes)
        frontier = list(range(start, len(tree)))
    return tree, rows


def chain_tree(root: int, path: list[int]) -> DraftTree:
    """A chain root -> path[0] -> path[1] ... (log-probs that a drafter does not read)."""
    tree = DraftTree.root(root)
    for i, tok in enumerate(path):
        tree = tree.add_nodes(torch.tensor([i]), torch.tensor([tok]), torch.tensor([-1.0 * (i + 1)]))
    return tree


def row_probs(row: torch.Tensor) -> dict[int, float]:
    """A draft row's finite entries as ``{token: probability}``."""
    idx = torch.nonzero(torch.isfinite(row)).flatten().tolist()
    return {i: math.exp(float(row[i])) for i in idx}
