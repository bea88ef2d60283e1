"""Side rows (specframe.SideRows, docs/hooks.md): tokens a drafter adds to the verify forward.

The target's argmax at every side row equals a plain recomputation of that row's context; the
output stays the greedy one (the tree never sees a side row); the step still reads the device
once; the batched engine (padded and flat) hands each row the side outputs it gets alone.
"""

from __future__ import annotations

import copy
import random

import pytest
import torch

from specframe.decode.batch import BatchDecoder
from specframe.decode.engine import SpecDecoder, make_plugin
from specframe.drafters.ngram import NgramDrafter
from specframe.models.target import TargetModel
from specframe.interfaces import SideRows
from specframe.testing.fixtures import VOCAB, tiny_target
from specframe.testing.harness import greedy_by_recomputation
from specframe.testing.host_reads import count_step_reads

MAX_NEW = 12


class SideProbe(NgramDrafter):
    """Prompt lookup plus side rows of two kinds, recording what ``commit`` hands back.

    ``chain``: k tokens continuing the committed text at offsets 1..k, each seeing all committed
    tokens and the chain before it (a Jacobi level). ``prefix``: lone tokens, row i seeing only
    the first ``p_i`` committed tokens and sitting right after them (position ``p_i``).
    """

    name = "side-probe"
    max_side_rows = 6
    kind = "chain"
    #: prompt -> [(committed tokens at the step, side rows, argmax)], across instances.
    seen: dict[tuple[int, ...], list] = {}

    def begin(self, prompt_ids, target_hidden=None):
        super().begin(prompt_ids, target_hidden)
        self.committed = prompt_ids.tolist()
        self.log = SideProbe.seen.setdefault((self.kind, *self.committed), [])
        self.rng = random.Random(len(self.committed))

    def side_rows(self, context_len, max_position):
        assert context_len == len(self.committed)
        k = self.rng.randint(1, self.max_side_rows)
        tokens = [self.rng.randrange(VOCAB) for _ in range(k)]
        if self.kind == "chain":
            return SideRows(tokens, list(range(1, k + 1)), torch.ones(k, k, dtype=torch.bool).tril())
        prefix = [self.rng.randint(1, context_len) for _ in range(k)]
        # offset from the root (position context_len - 1) to position p
        return SideRows(tokens, [p - context_len + 1 for p in prefix], torch.zeros(k, k, dtype=torch.bool),
                        prefix=prefix, logits=True)

    def commit(self, tokens, path=None, target_hidden=None, tree=None, side=None):
        super().commit(tokens, path, target_hidden, tree=tree)
        assert side is not None
        self.log.append((list(self.committed), side.rows, side.argmax, side.logits))
        self.committed += tokens.tolist()


class PrefixProbe(SideProbe):
    kind = "prefix"


def _expected(model, committed: list[int], rows: SideRows, kind: str) -> list[int]:
    """Each side row's argmax by a plain causal forward of the context it sees."""
    out = []
    for i, tok in enumerate(rows.tokens):
        context = committed + list(rows.tokens[: i + 1]) if kind == "chain" else committed[: rows.prefix[i]] + [tok]
        logits = model(torch.tensor([context])).logits[0, -1]
        out.append(int(logits.argmax()))
    return out


def _decoder(cls, target, policy="talon"):
    tgt = TargetModel(target)
    return SpecDecoder(tgt, cls(cls.Options(), tgt), make_plugin("policies", policy), make_plugin("verifiers", "greedy"))


@pytest.mark.parametrize("cls", [SideProbe, PrefixProbe], ids=["chain", "prefix"])
@pytest.mark.parametrize("prompt", [[5, 6, 7, 5, 6], [9], [1, 2, 3, 4, 1, 2, 3, 4, 1]])
def test_side_argmax_is_the_recomputed_argmax_and_the_output_stays_greedy(cls, prompt):
    model = tiny_target()
    SideProbe.seen.clear()
    out = _decoder(cls, model).generate(prompt, max_new_tokens=MAX_NEW, eos_token_id=None)
    assert out.tokens == greedy_by_recomputation(model, prompt, MAX_NEW, None)
    log = SideProbe.seen[(cls.kind, *prompt)]
    assert len(log) == len(out.steps)
    for committed, rows, argmax, logits in log:
        assert argmax == _expected(model, committed, rows, cls.kind)
        if cls.kind == "prefix":  # asked for logits: the rows' own, on the device
            assert logits.shape == (len(rows), VOCAB) and logits.argmax(-1).tolist() == argmax
    # The forward paid exactly the side rows on top of each tree (the stats count the tree).
    assert all(s.tree_size >= 1 for s in out.steps)


@pytest.mark.parametrize("layout", ["padded", "flat"])
@pytest.mark.parametrize("cls", [SideProbe, PrefixProbe], ids=["chain", "prefix"])
def test_batched_rows_get_their_solo_side_outputs(layout, cls):
    model = tiny_target()
    prompts = [[5, 6, 7, 5, 6], [9], [1, 2, 3, 4, 1, 2, 3, 4, 1], [3, 3]]
    SideProbe.seen.clear()
    for prompt in prompts:
        _decoder(cls, model).generate(prompt, max_new_tokens=MAX_NEW, eos_token_id=None)
    solo = {k: [(c, r.tokens, a) for c, r, a, _ in v] for k, v in SideProbe.seen.items()}
    SideProbe.seen.clear()
    dec = _decoder(cls, model)
    batch = BatchDecoder(dec, layout=layout,
                         drafter_factory=lambda d: cls(cls.Options(), d.target)).generate(
        prompts, max_new_tokens=MAX_NEW, eos_token_id=None)
    for prompt, out in zip(prompts, batch.outputs):
        assert out.tokens == greedy_by_recomputation(model, prompt, MAX_NEW, None)
    assert {k: [(c, r.tokens, a) for c, r, a, _ in v] for k, v in SideProbe.seen.items()} == solo


def test_side_rows_keep_the_exact_forward_bit_for_bit():
    """With the exact forward a row's logits depend only on its context, bit for bit: each side
    row's logits equal a plain forward of the context it sees, and the output is greedy's."""
    from specframe.models.exact import use_exact

    model = use_exact(copy.deepcopy(tiny_target()).float())
    prompt = [5, 6, 7, 5, 6]
    SideProbe.seen.clear()
    out = _decoder(PrefixProbe, model).generate(prompt, max_new_tokens=MAX_NEW, eos_token_id=None)
    assert out.tokens == greedy_by_recomputation(model, prompt, MAX_NEW, None)
    for committed, rows, argmax, logits in SideProbe.seen[("prefix", *prompt)]:
        for i, tok in enumerate(rows.tokens):
            with torch.inference_mode():  # the engine's mode (autograd's path rounds otherwise)
                alone = model(torch.tensor([committed[: rows.prefix[i]] + [tok]])).logits[0, -1]
            assert torch.equal(logits[i], alone)


@pytest.mark.parametrize("preallocate", [False, True], ids=["dynamic-cache", "preallocated"])
def test_side_rows_ride_in_the_steps_one_host_read(preallocate):
    target = TargetModel(tiny_target(), preallocate=preallocate)
    dec = SpecDecoder(target, SideProbe(SideProbe.Options(), target), make_plugin("policies", "talon"),
                      make_plugin("verifiers", "greedy"), strict=False)
    reads = count_step_reads(dec, [5, 6, 7, 5, 6], max_new_tokens=24)
    assert reads["steps"] > 1
    assert reads["engine"] == reads["steps"]


class BadProbe(SideProbe):
    bad: dict = {}

    def side_rows(self, context_len, max_position):
        fields = {"tokens": [1, 2], "offsets": [1, 2], "visible": torch.eye(2, dtype=torch.bool), **self.bad}
        return SideRows(**fields)


@pytest.mark.parametrize("bad,message", [
    ({"tokens": [1, VOCAB]}, "tokens must be in"),
    ({"offsets": [1]}, "2 offsets"),
    ({"visible": torch.eye(3, dtype=torch.bool)}, "visible"),
    ({"offsets": [1, 10_000]}, "outside"),
    ({"prefix": [1, 10_000]}, "prefix must be"),
    ({"tokens": [1] * 7, "offsets": [1] * 7, "visible": torch.eye(7, dtype=torch.bool)}, "max_side_rows 6"),
])
def test_bad_side_rows_are_refused_naming_the_drafter_and_field(bad, message):
    BadProbe.bad = bad
    with pytest.raises(ValueError, match=message) as err:
        _decoder(BadProbe, tiny_target()).generate([5, 6], max_new_tokens=3, eos_token_id=None)
    assert "side-probe" in str(err.value)
