"""The ``sam`` drafter against SAM-Decoding's own automata, step by step.

The oracle is the authors' code as Spec-Bench runs it: ``model/samd/sam/dyn_sam.py`` and
``static_sam.py``, vendored under ``tests/reference/samd/`` (README.md there: commit and licence)
and loaded by file path, so this runs everywhere, CI included, with nothing to install or skip.
The decision rule (the authors' ``DraftModel.lookup``, ``model/samd/draft.py``) is ported below in
as few lines as it takes.

On repetitive random streams (vocabularies 8-50: copies of earlier stretches, some mutated, and
fresh tokens), each step of a request (the committed text read in chunks of random size, as
steps accept them) gets from the drafter exactly the oracle's source, match length and draft, with
and without a static automaton, with a stub auxiliary drafter and without one; and both automata
equal the oracle's, state for state.
"""

from __future__ import annotations

import importlib.util
import random
import tempfile
from pathlib import Path
from types import SimpleNamespace

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from specframe.drafters.sam import SamDrafter, SamDrafterOptions
from specframe.drafters.sam_automaton import Automaton, Cursor, add_tokens
from specframe.drafters.sam_store import build, build_automaton, load
from specframe.testing.profiles import profile_examples
from specframe.tree import DraftTree

REFERENCE = Path(__file__).parent / "reference" / "samd"
EXAMPLES = profile_examples()


def _oracle(name: str):
    spec = importlib.util.spec_from_file_location(f"samd_reference_{name}", REFERENCE / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


DynSAM = _oracle("dyn_sam").DynSAM
StaticSAM = _oracle("static_sam").StaticSAM


def reference_lookup(dyn, static, start: int, len_bias: int, len_threshold: int, auxiliary: bool):
    """``DraftModel.lookup`` of model/samd/draft.py as (source, match, draft after the start
    token), the authors' pad of token 0 dropped (the drafter's rows pad with a fallback row)."""
    index_dyn, match_dyn = dyn.lookup(start)
    index_static, match_static = static.lookup(start) if static is not None else (0, 0)
    if auxiliary:
        match_static -= len_bias
        if max(match_dyn, match_static) >= len_threshold:
            if match_dyn >= match_static:
                seq = dyn.gen_draft(index_dyn, start)
                end = dyn.states[dyn.to_anc(index_dyn)].min_endpos
                return "dynamic", match_dyn, _unpad(seq, dyn.input_ids[end + 1 : end + dyn.n_predicts])
            seq = static.gen_draft(index_static, start)
            end = static.states[index_static].min_endpos
            return "static", match_static, _unpad(seq, static.input_ids[end + 1 : end + static.n_predicts])
        return "auxiliary", max(match_dyn, match_static), ()
    if match_dyn >= match_static:
        seq, _ = dyn.gen_dyn_draft(index_dyn, match_dyn, start)
        return "dynamic", match_dyn, tuple(seq[1:])
    # The static tree's rows come from the automaton's counts, checked state for state below.
    return "static", match_static, ()


def _unpad(seq: list[int], unpadded: list[int]) -> tuple[int, ...]:
    """The draft after the start token, checking that the rest of ``seq`` is the authors' pad."""
    assert seq[1 : 1 + len(unpadded)] == unpadded and set(seq[1 + len(unpadded) :]) <= {0}
    return tuple(unpadded)


def stream(rng: random.Random, vocab: int, length: int) -> list[int]:
    """A repetitive token stream: copies of earlier stretches (some with a token changed), and
    fresh tokens between them."""
    out: list[int] = []
    while len(out) < length:
        if len(out) > 4 and rng.random() < 0.6:
            start = rng.randrange(len(out))
            piece = out[start : start + rng.randint(2, 20)]
            if rng.random() < 0.3:
                piece[rng.randrange(len(piece))] = rng.randrange(vocab)
            out += piece
        else:
            out.append(rng.randrange(vocab))
    return out[:length]


def _chunks(rng: random.Random, tokens: list[int]) -> list[list[int]]:
    """``tokens`` as the commits of successive steps (1 to 8 tokens each)."""
    out, i = [], 0
    while i < len(tokens):
        n = rng.randint(1, 8)
        out.append(tokens[i : i + n])
        i += n
    return out


def _drafter(vocab: int, **options) -> SamDrafter:
    target = SimpleNamespace(vocab_size=vocab, device=torch.device("cpu"))
    return SamDrafter(SamDrafterOptions(**options), target)


class StubAuxiliary:
    """An auxiliary drafter that only says it was asked (the decision rule needs no model)."""

    def __init__(self) -> None:
        self.calls = 0

    def begin(self, prompt_ids, **_):
        pass

    def commit(self, tokens, path=None, tree=None, **_):
        pass

    def expand(self, tree, nodes):
        self.calls += 1
        return torch.zeros(len(nodes), 1)


def _run(rng: random.Random, vocab: int, corpus: list[list[int]] | None, options: dict, auxiliary: bool) -> int:
    """One request decoded against the oracle; returns the steps compared."""
    text = stream(rng, vocab, rng.randint(30, 260))
    prompt_len = rng.randint(1, len(text) - 1)
    n, bias, threshold = options["n_predicts"], options["len_bias"], options["len_threshold"]
    dyn, static = DynSAM(n, options["alpha"], device="cpu"), None
    with tempfile.TemporaryDirectory() as folder:
        if corpus is not None:
            eos = vocab - 1
            static = StaticSAM.build(corpus, eos, verbose=False)
            static.n_predicts = n
            build(corpus, list, folder, "test", vocab, separator=eos)
            options = {**options, "datastore": folder}
        drafter = _drafter(vocab, **options, auxiliary="ngram" if auxiliary else None)
    stub = StubAuxiliary()
    if auxiliary:
        drafter.auxiliary = stub
    prompt = text[:prompt_len]
    drafter.begin(torch.tensor(prompt))
    dyn.add_tokens(prompt[:-1])
    if static is not None:
        static.transfer_tokens(prompt[:-1])
    root, steps = prompt[-1], 0
    for chunk in _chunks(rng, text[prompt_len:]):
        want = reference_lookup(dyn, static, root, bias, threshold, auxiliary)
        got = drafter.choice()
        assert (got.source, got.match, got.draft) == want, f"step {steps}: {got} != oracle's {want}"
        if got.source == "auxiliary":
            drafter.expand(DraftTree.root(root), torch.tensor([0]))
            assert stub.calls == 1, "an auxiliary step's rows are the auxiliary's"
            stub.calls = 0
        drafter.commit(torch.tensor(chunk))
        dyn.add_tokens([root, *chunk[:-1]])
        if static is not None:
            static.transfer_tokens([root, *chunk[:-1]])
        root, steps = chunk[-1], steps + 1
    return steps


settings_ = settings(max_examples=EXAMPLES * 4, deadline=None)
option_space = st.fixed_dictionaries({
    "n_predicts": st.integers(2, 40), "len_threshold": st.integers(0, 8), "len_bias": st.integers(0, 6),
    "alpha": st.sampled_from([0.5, 1.0, 2.5, 4.0])})


@settings_
@given(seed=st.integers(0, 2**32 - 1), vocab=st.integers(8, 50), options=option_space, auxiliary=st.booleans())
def test_each_step_drafts_as_the_authors_dynamic_automaton(seed, vocab, options, auxiliary):
    assert _run(random.Random(seed), vocab, None, options, auxiliary) >= 1


@settings_
@given(seed=st.integers(0, 2**32 - 1), vocab=st.integers(8, 50), options=option_space, auxiliary=st.booleans())
def test_each_step_drafts_as_the_authors_with_a_static_automaton(seed, vocab, options, auxiliary):
    rng = random.Random(seed)
    corpus = [stream(rng, vocab, rng.randint(1, 80)) for _ in range(rng.randint(1, 4))]
    assert _run(rng, vocab, corpus, options, auxiliary) >= 1


@settings(max_examples=EXAMPLES * 3, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), vocab=st.integers(8, 50))
def test_automata_equal_the_authors_state_for_state(seed, vocab):
    rng = random.Random(seed)
    text = stream(rng, vocab, rng.randint(1, 200))
    dyn, ours, cursor = DynSAM(), Automaton(), Cursor()
    for chunk in _chunks(rng, text):
        dyn.add_tokens(chunk)
        add_tokens(ours, cursor, chunk)
        assert (cursor.state, cursor.length) == (dyn.cur_index, dyn.cur_length)
    assert ours.tokens == dyn.input_ids
    assert [(s.next, s.link, s.length, s.min_endpos) for s in dyn.states] == list(
        zip(ours.next, ours.link, ours.length, ours.min_endpos))
    corpus = [stream(rng, vocab, rng.randint(1, 60)) for _ in range(rng.randint(1, 4))]
    static, frozen = StaticSAM.build(corpus, vocab - 1, verbose=False), build_automaton(corpus, vocab - 1)
    assert frozen.tokens == static.input_ids
    assert [(s.next, s.link, s.length, s.min_endpos, s.cnt_endpos) for s in static.states] == [
        (dict(frozen.children(i)), frozen.link[i], frozen.length[i], frozen.min_endpos[i], frozen.count[i])
        for i in range(len(frozen.link))]


def test_a_saved_static_automaton_loads_as_built(tmp_path):
    corpus = [[1, 2, 3, 1, 2, 4], [2, 3, 1]]
    build(corpus, list, tmp_path, "test", 8, separator=7)
    assert load(tmp_path, 8) == build_automaton(corpus, 7)
