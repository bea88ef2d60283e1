"""The drafter conformance properties call a drafter as the engine does, and test what a drafter
declares instead of failing on it.

Each test runs one property of :class:`DrafterConformance` on a small hand-written drafter
(model-free rows over the tiny float64 target's vocabulary) by calling the property directly.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import pytest
import torch

from specframe.decode.engine import SpecDecoder
from specframe.interfaces import Drafter
from specframe.models.target import TargetModel
from specframe.testing import fixtures as fx
from specframe.testing.conformance import DrafterConformance
from specframe.tree import DraftTree
from specframe.tree import DraftTree


class _TableDrafter(Drafter):
    """Rows from a bigram table: a node's row is a softmax over how often each token followed
    the node's token. Honest (a row depends on its node's token and the table only); the table
    learns from committed tokens, and also from the target's argmax at every verified node when
    ``needs_target_logits`` is set, rejected nodes included."""

    name = "test-table"
    calls: ClassVar[list[tuple[str, tuple[Any, ...], dict[str, Any]]]] = []
    #: Keep the table across generations (a hot start), whatever ``persistent_state`` says.
    hot: ClassVar[bool] = False
    #: A table every instance shares (None: one per instance).
    shared: ClassVar[torch.Tensor | None] = None

    def __init__(self, options: Any, target: TargetModel) -> None:
        super().__init__(options, target)
        fresh = torch.zeros(self.vocab_size, self.vocab_size, dtype=torch.float64)
        self.counts = fresh if self.shared is None else self.shared
        self.last = 0

    def _learn(self, tokens: list[int]) -> None:
        for a, b in zip([self.last] + tokens, tokens):
            self.counts[a, b] += 1
        self.last = tokens[-1]

    def begin(self, prompt_ids: torch.Tensor, target_hidden: Any = None, **kwargs: Any) -> None:
        type(self).calls.append(("begin", (prompt_ids, target_hidden), kwargs))
        if not self.hot:
            self.counts.zero_()
        self.last = int(prompt_ids[0])
        self._learn(prompt_ids.tolist())

    def expand(self, tree: DraftTree, nodes: torch.Tensor) -> torch.Tensor:
        assert nodes.dtype == torch.long, f"expand got {nodes.dtype} node ids"
        return torch.log_softmax(3.0 * self.counts[tree.tokens[nodes]], dim=-1)

    def commit(self, tokens: torch.Tensor, path: Any = None, target_hidden: Any = None, **kwargs: Any) -> None:
        type(self).calls.append(("commit", (tokens, path, target_hidden), kwargs))
        logits, tree = kwargs.get("target_logits"), kwargs.get("tree")
        if getattr(self, "needs_target_logits", False) and tree is not None and logits is not None:
            best = logits.argmax(dim=-1)
            self.counts[tree.tokens, best] += 0.5   # the target's habit at every node it saw
        self._learn(tokens.tolist())


class _DeadEndDrafter(_TableDrafter):
    """Only the root has candidates: every deeper row is all -inf (an n-gram table with no match)."""

    def expand(self, tree: DraftTree, nodes: torch.Tensor) -> torch.Tensor:
        rows = super().expand(tree, nodes)
        return torch.where((nodes == 0).unsqueeze(-1), rows, torch.full_like(rows, -math.inf))


def _suite(drafter_cls: type[Drafter], **attrs: Any) -> DrafterConformance:
    """A DrafterConformance instance over ``drafter_cls`` (with class attributes ``attrs``)."""
    kind = type(f"_{drafter_cls.__name__}", (drafter_cls,), {"calls": [], **attrs})

    class Suite(DrafterConformance):
        plugin = "test-table"

        def make_drafter(self, target: TargetModel) -> Drafter:
            return kind(None, target)

    suite = Suite()
    suite.kind = kind
    return suite


def test_expand_top_property_takes_a_frontier_of_dead_ends():
    """Rows past the root have no finite entry, so the frontier empties: the property stops
    there and never hands the drafter float node ids (it indexed with them and raised)."""
    _suite(_DeadEndDrafter).test_expand_top_equals_the_selection_over_its_rows()


def _shape(call: tuple[str, tuple[Any, ...], dict[str, Any]]) -> tuple[Any, ...]:
    """What a begin/commit call looked like: argument types and dtypes, keyword names."""
    what, args, kwargs = call

    def kind(value: Any) -> Any:
        if isinstance(value, DraftTree):  # a tree the CPU's policies keep in host lists is one too
            return "DraftTree"
        return (type(value).__name__, value.dtype) if isinstance(value, torch.Tensor) else type(value).__name__

    return what, tuple(kind(a) for a in args), tuple(sorted((k, kind(v)) for k, v in kwargs.items()))


@pytest.mark.parametrize("needs_logits", [False, True])
def test_honesty_property_begins_and_commits_as_the_engine_does(needs_logits):
    """The calls the honesty property makes have the engine's form: ``tree=`` always,
    ``target_logits=`` for a drafter that declares ``needs_target_logits`` (the suite called
    ``commit`` without ``tree``, so a drafter learning from rejected branches was never tested
    on its real commit path). The engine's calls are recorded on the same drafter."""
    suite = _suite(_TableDrafter, needs_target_logits=needs_logits)
    suite.test_tree_attention_is_honest()
    by_suite = {_shape(c) for c in suite.kind.calls}
    suite.kind.calls.clear()
    target = TargetModel(fx.tiny_target())
    dec = SpecDecoder.build(target=target, drafter=suite.make_drafter(target), policy="talon", strict=True)
    for prompt in ([5, 17, 9, 33, 2, 40], [7]):  # a one-token prompt begins without a prefill
        dec.generate(prompt, max_new_tokens=12, eos_token_id=None, seed=0)
    by_engine = {_shape(c) for c in suite.kind.calls}
    assert by_suite <= by_engine, f"calls the engine never makes: {by_suite - by_engine}"
    assert {c for c in by_suite if c[0] == "commit"} == {c for c in by_engine if c[0] == "commit"}
    commits = [kw for what, _, kw in by_suite if what == "commit"]
    assert commits and all(dict(kw).get("tree") == "DraftTree" for kw in commits)
    assert all(("target_logits" in dict(kw)) == needs_logits for kw in commits)


def test_a_drafter_that_learns_from_every_verified_node_is_held_to_its_own_state():
    """Learning from the target's logits at rejected nodes is legitimate but no fresh drafter
    can repeat it: the honesty reference is the drafter as the step began, so an honest
    learning drafter passes (its rows still depend on the node's path only)."""
    _suite(_TableDrafter, needs_target_logits=True).test_tree_attention_is_honest()


def test_begin_must_forget_unless_persistent_state_is_declared():
    """A hot-start table that survives ``begin`` changes the second generation's trees: the
    suite fails it, unless the drafter declares ``persistent_state`` (then a fresh instance
    must reproduce a fresh run, and the tokens must stay lossless)."""
    with pytest.raises(AssertionError, match="state leaked|differs from a fresh one"):
        _suite(_TableDrafter, hot=True).test_begin_forgets_earlier_generations()
    _suite(_TableDrafter, hot=True, persistent_state=True).test_begin_forgets_earlier_generations()


def test_persistent_state_shared_between_instances_fails():
    """The declaration covers state kept by one instance; a table shared by every instance
    makes a fresh drafter differ from a fresh run, which the suite reports."""
    shared = torch.zeros(fx.VOCAB, fx.VOCAB, dtype=torch.float64)
    with pytest.raises(AssertionError, match="fresh drafter instance does not reproduce a fresh run"):
        _suite(_TableDrafter, hot=True, persistent_state=True, shared=shared).test_begin_forgets_earlier_generations()
