"""What the engine refuses from its plugins, and how it names the culprit.

A policy must return a valid tree within the engine's budget whose root is the last committed
token; a verifier must return ``(last, bonus)`` as 0-dim integer tensors on the tree's device.
Checking everything before the forward costs device reads every step, so by default the engine
checks shapes on the host, folds the log-probs' finiteness into one device flag, and checks the
value invariants on the host from the tree that travels with the verdict's one read; strict mode
(tests, the conformance suite) checks everything before the target runs.
"""

from __future__ import annotations

import math
import os
from typing import Any

import torch

from specframe.tree import DraftTree, InvalidTreeError

#: Turns strict mode on for decoders built with ``strict=None`` (the default) when set to
#: anything but "", "0", "false", "no" or "off"; the pytest plugin sets it to "1" for test runs.
STRICT_VARIABLE = "SPECFRAME_STRICT"


class EngineError(RuntimeError):
    """A plugin broke the engine's contract (e.g. an invalid or over-budget tree)."""


def strict_default() -> bool:
    """Whether ``SpecDecoder(strict=None)`` runs in strict mode: ``$SPECFRAME_STRICT`` says."""
    return os.environ.get(STRICT_VARIABLE, "").strip().lower() not in ("", "0", "false", "no", "off")


def reject_tree(policy: str, tree: DraftTree, root: int, limit: int) -> None:
    """Raise EngineError naming the first broken invariant of ``tree``, if there is one."""
    try:
        tree.check_valid(limit)
        if int(tree.tokens[0]) != root:
            raise InvalidTreeError(f"root token {int(tree.tokens[0])} is not the last committed token {root}")
    except InvalidTreeError as err:
        raise EngineError(f"policy {policy!r} returned an invalid tree: {err}") from err


def tree_flag(policy: str, tree: DraftTree, root: int, limit: int, strict: bool) -> torch.Tensor | bool:
    """The device part of the tree's validity, a 0-dim flag to read with the verdict: its
    log-probs are finite (a plain bool for a tree held in host lists, :meth:`DraftTree.has_host`).

    Shapes and size are known on the host and must hold before anything indexes with the tree,
    so breaking them raises now; strict mode checks every invariant now. The value invariants
    (root, order, depths, distinct siblings) are checked on the host after the step's one read,
    which carries the tree's parents, tokens and depths (:func:`specframe.tree.tree_problem`).
    """
    if strict:
        reject_tree(policy, tree, root, limit)
    try:
        tree._check_shapes(limit)
    except InvalidTreeError as err:
        raise EngineError(f"policy {policy!r} returned an invalid tree: {err}") from err
    if tree.has_host():  # a tree still in host lists: its flag from them, no tensor op
        return all(map(math.isfinite, tree.host().logp))
    return torch.isfinite(tree.logp).all()


def checked_decision(verifier: str, tree: DraftTree, decision: Any, vocab_size: int,
                     strict: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """``verify``'s ``(last, bonus)``, refused with a message if it breaks the convention.

    The form (0-dim integer tensors on the tree's device) is metadata, checked every step for
    free; the values need a device read, so only strict mode checks their range.
    """
    problem = None
    if not (isinstance(decision, tuple) and len(decision) == 2):
        problem = f"returned {type(decision).__name__}, not a (last, bonus) pair"
    else:
        for what, value in zip(("last", "bonus"), decision):
            if not (isinstance(value, torch.Tensor) and value.dim() == 0 and not value.is_floating_point()
                    and not value.is_complex() and value.device == tree.device):
                problem = f"returned {what}={value!r}"
                break
        if problem is None and strict:
            last, bonus = (int(v) for v in decision)
            if not (0 <= last < len(tree) and 0 <= bonus < vocab_size):
                problem = (f"returned node {last} of a {len(tree)}-node tree and bonus token {bonus} "
                           f"of a {vocab_size}-token vocabulary")
    if problem is not None:
        raise EngineError(
            f"verifier {verifier!r} {problem}: verify must return the deepest accepted node "
            f"and the bonus token as two 0-dim integer tensors on the tree's device ({tree.device})"
        )
    return decision


def checked_root_tokens(verifier: str, tokens: torch.Tensor, rows: int, device: torch.device, vocab_size: int,
                        strict: bool) -> torch.Tensor:
    """``root_tokens``' answer for ``rows`` switched-off rows, refused with a message if it is
    not one integer token per row on the trees' ``device`` or, in strict mode, if a token is
    outside the vocabulary: as :func:`checked_decision` checks ``verify``'s (the form is
    metadata, free every step; the values need a device read)."""
    problem = None
    if not isinstance(tokens, torch.Tensor):
        problem = f"returned {type(tokens).__name__}"
    elif tuple(tokens.shape) != (rows,) or tokens.is_floating_point() or tokens.is_complex():
        problem = f"returned {tuple(tokens.shape)} {tokens.dtype} for {rows} switched-off rows"
    elif tokens.device != torch.device(device):
        problem = f"returned {tuple(tokens.shape)} {tokens.dtype} on {tokens.device}, not on the tree's device ({device})"
    elif strict:
        bad = [int(t) for t in tokens.tolist() if not 0 <= int(t) < vocab_size]
        if bad:
            problem = f"returned token {bad[0]} of a {vocab_size}-token vocabulary"
    if problem is not None:
        raise EngineError(f"verifier {verifier!r}: root_tokens {problem}; return one integer token per row, "
                          f"on the tree's device, inside the vocabulary")
    return tokens
