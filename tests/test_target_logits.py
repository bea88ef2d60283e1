"""Drafters that declare ``needs_target_logits`` see the target's own logits: the prefill's in
``begin`` and, in ``commit``, exactly the tensor the verifier saw; every step commits, the last
one included; drafters that do not declare it get no such keyword and a prefill without the
lm_head rows nobody reads."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import specframe
from specframe.drafters.ngram import NgramDrafter, NgramDrafterOptions
from specframe.decode.engine import make_plugin
from specframe.testing.fixtures import tiny_target


class _Spy(NgramDrafter):
    """The n-gram drafter, recording every target output the engine hands it."""

    needs_target_logits = True

    def __init__(self, options: Any, target: Any) -> None:
        super().__init__(options, target)
        self.prefill: torch.Tensor | None = None
        self.commits: list[tuple[list[int], torch.Tensor, Any, torch.Tensor]] = []

    def begin(self, prompt_ids, target_hidden=None, target_logits=None):
        super().begin(prompt_ids)
        self.prefill = target_logits

    def commit(self, tokens, path=None, target_hidden=None, tree=None, target_logits=None):
        super().commit(tokens, path, tree=tree)
        self.commits.append((tokens.tolist(), path, tree, target_logits))


class _SeeingVerifier(specframe.Verifier):
    """Greedy, keeping the logits objects it was given."""

    name = "seeing-greedy"

    def __init__(self) -> None:
        super().__init__(None)
        self.inner = make_plugin("verifiers", "greedy")
        self.seen: list[torch.Tensor] = []

    def verify(self, tree, target_logits, generator):
        self.seen.append(target_logits)
        return self.inner.verify(tree, target_logits, generator)


def _decoder(model: Any, policy: Any = "talon") -> tuple[specframe.SpecDecoder, _Spy, _SeeingVerifier]:
    target = specframe.TargetModel(model)
    spy, verifier = _Spy(NgramDrafterOptions(), target), _SeeingVerifier()
    return specframe.SpecDecoder(target, spy, make_plugin("policies", policy), verifier, strict=False), spy, verifier


def _tree_logits(model: Any, committed: list[int], tree: specframe.DraftTree) -> torch.Tensor:
    """Reference: a fresh target prefilled with ``committed[:-1]`` forwards ``tree`` alone."""
    ref = specframe.TargetModel(model)
    ref.reset()
    if len(committed) > 1:
        ref.causal_forward(torch.tensor(committed[:-1]))
    return ref.tree_forward(tree.tokens, tree.positions(len(committed)), tree.ancestor_mask()).logits[0]


@pytest.mark.parametrize("policy", ["talon", ("eagle", {"budget": 10}), ("chain", {"gamma": 3})])
def test_commit_gets_the_verifiers_logits_row_for_row(policy):
    model = tiny_target()
    dec, spy, verifier = _decoder(model, policy)
    prompt = [4, 9, 12, 30, 2, 17, 9, 12]
    out = dec.generate(prompt, max_new_tokens=20, eos_token_id=None)
    assert len(spy.commits) == len(out.steps) == len(verifier.seen)
    committed = list(prompt)
    for step, ((tokens, path, tree, logits), seen) in enumerate(zip(spy.commits, verifier.seen)):
        assert logits is seen, f"step {step}: commit got another tensor than the verifier"
        assert logits.shape == (len(tree), model.config.vocab_size)
        want = _tree_logits(model, committed, tree)
        assert torch.allclose(logits, want, atol=1e-10, rtol=0), f"step {step}: rows differ from a fresh forward"
        committed += tokens


def test_begin_gets_the_prefills_logits_and_none_for_one_token():
    model = tiny_target()
    dec, spy, _ = _decoder(model)
    prompt = [4, 9, 12, 30, 2, 17]
    dec.generate(prompt, max_new_tokens=4, eos_token_id=None)
    want = model(input_ids=torch.tensor([prompt[:-1]])).logits[0]
    assert spy.prefill.shape == (len(prompt) - 1, model.config.vocab_size)
    assert torch.allclose(spy.prefill, want, atol=1e-10, rtol=0)
    dec.generate([7], max_new_tokens=4, eos_token_id=None)
    assert spy.prefill is None


@pytest.mark.parametrize("max_new, eos", [(1, None), (9, None), (40, 3)])
def test_the_last_step_commits_its_whole_decision(max_new, eos):
    model = tiny_target()
    dec, spy, _ = _decoder(model)
    out = dec.generate([4, 9, 12, 30, 2, 17, 9], max_new_tokens=max_new, eos_token_id=eos)
    assert len(spy.commits) == len(out.steps)
    tokens, path, tree, _ = spy.commits[-1]
    assert len(tokens) == len(path)  # accepted drafts + bonus, even where the output was cut
    assert tokens[:-1] == tree.tokens[path[1:]].tolist()
    emitted = out.steps[-1].emitted
    assert out.tokens[-emitted:] == tokens[:emitted]


def test_other_drafters_get_no_keyword_and_a_one_row_prefill(monkeypatch):
    model = tiny_target()
    target = specframe.TargetModel(model)
    rows: list[int] = []
    forward = target.causal_forward

    def recording(*args, **kwargs):
        out = forward(*args, **kwargs)
        rows.append(out.logits.shape[1])
        return out

    monkeypatch.setattr(target, "causal_forward", recording)
    dec = specframe.SpecDecoder.build(target=target, drafter="ngram", policy="talon")  # no target_logits kwarg
    dec.generate([4, 9, 12, 30, 2, 17], max_new_tokens=6, eos_token_id=None)
    assert rows == [1]


def test_last_logits_only_is_the_full_forwards_last_row():
    model = tiny_target()
    full, last = specframe.TargetModel(model), specframe.TargetModel(model)
    full.reset(), last.reset()
    tokens = torch.tensor([4, 9, 12, 30, 2])
    want = full.causal_forward(tokens).logits[0, -1]
    got = last.causal_forward(tokens, last_logits_only=True).logits
    assert got.shape == (1, 1, model.config.vocab_size)
    assert torch.allclose(got[0, -1], want, atol=1e-10, rtol=0)  # a 1-row GEMM may round apart
    assert last.cache_len == full.cache_len == len(tokens)


def test_the_documented_table_drafter_runs_and_learns():
    """docs/drafters.md's worked example (the adjacency-table update) stays true: lossless, and
    it fills rows from the verifier's logits."""
    import math
    import re
    from pathlib import Path

    from specframe.testing.harness import greedy_reference

    text = (Path(__file__).resolve().parent.parent / "docs" / "drafters.md").read_text(encoding="utf-8")
    code = next(block for block in re.findall(r"```python\n(.*?)```", text, re.S) if "class TableDrafter" in block)
    namespace = {"specframe": specframe, "torch": torch, "math": math}
    exec(compile(code, "docs/drafters.md", "exec"), namespace)
    model = tiny_target()
    target = specframe.TargetModel(model)
    drafter = namespace["TableDrafter"](None, target)
    dec = specframe.SpecDecoder.build(target=target, drafter=drafter, policy="talon")
    prompt = [4, 9, 12, 30, 2, 17, 9, 12]
    assert dec.generate(prompt, max_new_tokens=16, eos_token_id=None).tokens == greedy_reference(model, prompt, 16, None)
    assert int(torch.isfinite(drafter.logp[:-1]).any(-1).sum()) > 5
