"""Answer records: one answer in Spec-Bench's format with its per-step statistics, the kept
trees as plain data (what trees.html and the shape plots read) and the root's confidence."""

from __future__ import annotations

import time
from typing import Any

from specframe.experiments.baselines import ArmOutput
from specframe.experiments.config import ArmConfig
from specframe.experiments.data import Question
from specframe.experiments.runs import AnswerRecord, Choice, steps_columns
from specframe.experiments.explorer.tokentext import TokenText


def _pick_trees(trees: list, k: int | None, text: TokenText | None = None, max_budget: int | None = None) -> list[dict]:
    """``k`` of the steps' :class:`~specframe.decode.engine.StepView` s spread over the generation
    (``None``: every step), as plain data: see :func:`tree_record`."""
    if not trees or (k is not None and k <= 0):
        return []
    if k is None:
        idx = list(range(len(trees)))
    else:
        idx = sorted({max(0, int(round((i + 1) * len(trees) / (k + 1))) - 1) for i in range(k)})
    return [tree_record(trees[i], i, text, max_budget) for i in idx]


def tree_record(view: Any, step: int, text: TokenText | None = None, max_budget: int | None = None) -> dict:
    """One verified step's tree as plain data: its step index (over all turns), tokens, parents,
    depths, ranks, cumulative draft log-probabilities ``logp``, the accepted node indices (root
    first), with ``text`` each node's decoded token and with ``max_budget`` the node budget the
    policy was given (its largest tree less what the context cut, root included)."""
    tree = view.tree
    out = {"step": step, "tokens": tree.tokens.tolist(), "parents": tree.parents.tolist(),
           "depths": tree.depths.tolist(), "ranks": tree.ranks.tolist(),
           "logp": [round(float(v), 5) for v in tree.logp.tolist()], "accepted": view.path}
    if text is not None:
        out["text"] = text.tokens(out["tokens"])
    if max_budget is not None:
        out["budget"] = int(max_budget) - int(getattr(view.stats, "budget_cut", 0))
    return out


def root_confidence(tree: Any) -> float | None:
    """The drafter's confidence at the root: the largest draft probability among the root's
    children (None for a tree that is only its root)."""
    first = tree.logp[tree.parents == 0]
    return round(float(first.max().exp()), 5) if len(first) else None


def policy_budget(runner: Any) -> int | None:
    """The largest tree of a specframe arm's policy, root included (None for baselines)."""
    policy = getattr(getattr(runner, "decoder", None), "policy", None)
    try:
        return int(policy.max_budget) if policy is not None else None
    except Exception:  # a policy without a known largest tree: the record leaves the budget out
        return None


def _seconds(value: float | None) -> float | None:
    """A per-turn time as the record keeps it (7 decimals, like the wall times)."""
    return None if value is None else round(float(value), 7)


def make_record(arm: ArmConfig, question: Question, repeat: int, model_id: str, greedy: bool,
                turns: list[tuple[list[int], ArmOutput, float, str]], trees_k: int,
                text: TokenText | None = None, max_budget: int | None = None, explore: bool = False) -> AnswerRecord:
    """One answer in Spec-Bench's format plus per-step statistics.

    ``turns``: per turn ``(prompt ids, output, wall seconds, decoded text)``. ``trees_k``: how
    many steps' trees to keep. ``text``: decodes the kept trees' node tokens. ``explore``: an
    explorer question's answer: every step's tree, and (with ``text``) each output token's text,
    what trees.html reads.
    """
    outs = [t[1] for t in turns]
    steps = [s for o in outs for s in (o.steps or [])]
    trees = [t for o in outs for t in o.trees]
    choice = Choice(turns=[t[3] for t in turns], new_tokens=[len(o.tokens) for o in outs],
                    wall_time=[round(t[2], 7) for t in turns],
                    accept_lengths=[a for o in outs for a in o.accept_lengths],
                    decoding_steps=[o.target_forwards for o in outs])
    columns = steps_columns(steps)
    if steps and len(trees) == len(steps):  # the shape plot's x: read after the clock stopped
        columns["root_p"] = [root_confidence(v.tree) for v in trees]
    scored = all(o.nll is not None for o in outs)
    prefill = [_seconds(o.prefill_time) for o in outs]
    first = [_seconds(o.time_to_first_token) for o in outs]
    return AnswerRecord(
        question_id=question.question_id, category=question.category,
        answer_id=f"{arm.slug}/{question.question_id}/{repeat}", model_id=model_id, arm=arm.name,
        repeat=repeat, greedy=greedy, tstamp=time.time(), choice=choice,
        draft_forwards=[o.draft_forwards for o in outs], prompt_tokens=[len(t[0]) for t in turns],
        output_ids=[o.tokens for o in outs], steps=columns,
        trees=_pick_trees(trees, None if explore else trees_k, text, max_budget),
        token_text=[text.pieces(o.tokens) for o in outs] if explore and text is not None else [],
        prefill_time=prefill if any(v is not None for v in prefill) else None,
        time_to_first_token=first if any(v is not None for v in first) else None,
        # per turn: the tokens' negative log-likelihood under the target (nats, summed)
        extra={"nll": [round(o.nll, 6) for o in outs]} if scored else {},
    )

