"""The verifier's batched answer for rows switched off (``Verifier.root_tokens``) against its
own ``verify`` of each root alone, and the engine taking it: one call for every off row, the
same tokens as plain greedy decoding, and the per-row path kept for verifiers without it."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from specframe.decode.allocate import AllocatorOptions, BatchAllocator
from specframe.decode.batch import BatchDecoder
from specframe.decode.engine import SpecDecoder, make_plugin, root_read
from specframe.decode.read import read_step
from specframe.interfaces import Verifier
from specframe.testing.fixtures import default_drafter, tiny_target
from specframe.testing.harness import greedy_by_recomputation
from specframe.models.target import TargetModel
from specframe.tree import DraftTree

PROMPTS = [[5, 9, 2], [7], [11, 3, 3, 8, 1, 40], [2, 2], [1, 2, 3]]


@settings(max_examples=40, deadline=None)
@given(rows=st.integers(1, 6), vocab=st.integers(2, 12), seed=st.integers(0, 2**16),
       ties=st.booleans())
def test_greedy_root_tokens_equal_verify_on_each_root(rows, vocab, seed, ties):
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(rows, vocab, generator=gen)
    if ties:  # coarse logits: equal maxima, where the tie rule must match verify's
        logits = logits.round()
    greedy = make_plugin("verifiers", "greedy")
    batched = greedy.root_tokens(logits, [None] * rows).tolist()
    for r in range(rows):
        tree = DraftTree.root(3)
        last, bonus = greedy.verify(tree, logits[r : r + 1], None)
        assert int(last) == 0
        assert batched[r] == int(bonus)
        assert _fields(root_read(batched[r], tree.device)) == _fields(read_step(tree, last, bonus, torch.tensor(True)))


def _fields(read) -> tuple:
    """Every field of a StepRead, its path as a list (tensors compare by identity in a dataclass)."""
    return (read.ok, read.tokens, read.ranks, read.widths, read.contiguous, read.children, read.path.tolist())


def _decoder(verifier: Verifier) -> SpecDecoder:
    target = TargetModel(tiny_target())
    return SpecDecoder(target, default_drafter("model", target), make_plugin("policies", ("chain", {"gamma": 3})),
                       verifier)


def test_an_all_off_step_asks_the_verifier_once_and_decodes_greedily(monkeypatch):
    verifier = make_plugin("verifiers", "greedy")
    dec = _decoder(verifier)
    greedy = [greedy_by_recomputation(dec.target.model, p, 6, None) for p in PROMPTS]
    calls = {"root_tokens": 0, "verify": 0}
    root_tokens, verify = verifier.root_tokens, verifier.verify

    def count_root_tokens(logits, generators):
        calls["root_tokens"] += 1
        return root_tokens(logits, generators)

    def count_verify(*args):
        calls["verify"] += 1
        return verify(*args)

    monkeypatch.setattr(verifier, "root_tokens", count_root_tokens)
    monkeypatch.setattr(verifier, "verify", count_verify)
    out = BatchDecoder(dec, ("threshold", {"disable_by_batch_size": 1})).generate(PROMPTS, 6, None)
    assert [o.tokens for o in out.outputs] == greedy
    assert calls == {"root_tokens": len(out.step_times), "verify": 0}


def test_a_verifier_without_root_tokens_verifies_each_off_row_alone():
    class Plain(Verifier):
        """Greedy, without the batched answer (the default ``root_tokens``)."""

        name = "plain-greedy"

        def verify(self, tree, target_logits, generator=None):
            return make_plugin("verifiers", "greedy").verify(tree, target_logits, generator)

    dec = _decoder(Plain(None))
    greedy = [greedy_by_recomputation(dec.target.model, p, 6, None) for p in PROMPTS]
    for threshold in (1, 3):  # every row off; off only while 3 or more are live
        out = BatchDecoder(dec, ("threshold", {"disable_by_batch_size": threshold})).generate(PROMPTS, 6, None)
        assert [o.tokens for o in out.outputs] == greedy


class EveryOther(BatchAllocator):
    """Row 0, 2, 4, ... of each step switched off, the others up to their caps: every step mixes
    batched roots with verified trees."""

    name = "every-other"

    def budgets(self, caps, history, total):
        return [1 if b % 2 == 0 else cap for b, cap in enumerate(caps)]


def test_steps_that_mix_off_and_speculating_rows_stay_greedy():
    dec = _decoder(make_plugin("verifiers", "greedy"))
    greedy = [greedy_by_recomputation(dec.target.model, p, 8, None) for p in PROMPTS]
    out = BatchDecoder(dec, EveryOther(AllocatorOptions())).generate(PROMPTS, 8, None, max_live=3)
    assert [o.tokens for o in out.outputs] == greedy
    assert {s.tree_size > 1 for o in out.outputs for s in o.steps} == {False, True}


def test_root_tokens_of_the_wrong_form_are_refused_naming_the_verifier():
    from specframe.decode.contract import EngineError
    from specframe.verifiers.greedy import GreedyVerifier

    class OneShort(GreedyVerifier):
        """A plugin whose batched answer drops a row."""

        name = "one-short"

        def root_tokens(self, root_logits, generators):
            return root_logits.max(dim=-1).indices[1:]

    batcher = BatchDecoder(_decoder(OneShort(None)), ("threshold", {"disable_by_batch_size": 1}))
    with pytest.raises(EngineError, match=r"verifier 'one-short': root_tokens returned \(4,\)"):
        batcher.generate(PROMPTS, 4, None)


class Elsewhere(Verifier):
    """Greedy, but its batched answer is bent by ``bend`` (off the device, out of the vocabulary)."""

    name = "elsewhere"

    def __init__(self, bend) -> None:
        super().__init__(None)
        self.bend = bend

    def verify(self, tree, target_logits, generator=None):
        return make_plugin("verifiers", "greedy").verify(tree, target_logits, generator)

    def root_tokens(self, root_logits, generators):
        return self.bend(root_logits.argmax(dim=-1), root_logits.shape[-1])


@pytest.mark.parametrize("bend,match", [
    (lambda tokens, vocab: tokens.to("meta"), r"root_tokens returned .* on meta, not on the tree's device \(cpu\)"),
    (lambda tokens, vocab: tokens + vocab, r"root_tokens returned token \d+ of a \d+-token vocabulary"),
])
def test_root_tokens_off_the_device_or_the_vocabulary_are_refused_naming_the_verifier(bend, match):
    """As ``verify``'s answer is checked (checked_decision): the device every step, the range in
    strict mode, in an error that names the verifier, not a later torch.cat or embedding error."""
    from specframe.decode.contract import EngineError

    dec = _decoder(Elsewhere(bend))
    dec.strict = True
    batcher = BatchDecoder(dec, ("threshold", {"disable_by_batch_size": 1}))
    with pytest.raises(EngineError, match=r"verifier 'elsewhere': " + match):
        batcher.generate(PROMPTS, 4, None)
