"""The ``sam`` drafter (SAM-Decoding): its rows, the SAMD rule with an auxiliary drafter, the
static automaton's datastore, and losslessness (greedy with every policy, sampling in
distribution) alone and with ``recycle``, ``ngram`` and ``eagle3`` as the auxiliary."""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import tempfile

import pytest
import torch
from click.testing import CliRunner

import specframe
from specframe.cli import cli
from specframe.decode.engine import SpecDecoder, make_plugin
from specframe.drafters.datastore import DatastoreError
from specframe.drafters.eagle_checkpoint import random_head
from specframe.drafters.sam import PAD, SamDrafter
from specframe.drafters.sam_store import build
from specframe.models.target import TargetModel
from specframe.options import OptionError
from specframe.testing.conformance import DrafterConformance
from specframe.testing.distribution import chi_square_pvalue
from specframe.testing.fixtures import VOCAB, fixed_policy_spec, is_builtin, tiny_target
from specframe.testing.harness import greedy_by_recomputation
from specframe.testing.host_reads import count_step_reads
from specframe.testing.models import tiny_model
from specframe.tree import DraftTree

POLICIES = specframe.get_registry().names("policies", dist="specframe")  # built-ins only: a user's plugin may sit beside them
ENGINE_POLICIES = tuple(fixed_policy_spec(p) for p in POLICIES)
REPEAT = [4, 9, 12, 30, 2, 17, 9, 12, 30, 2, 17, 9]


def _sam(target: TargetModel, **options) -> SamDrafter:
    return make_plugin("drafters", ("sam", options), target)


def _rows(drafter: SamDrafter, committed: list[int], path: list[int]) -> torch.Tensor:
    """The row after ``path`` (a chain below the root ``committed[-1]``)."""
    drafter.begin(torch.tensor(committed))
    tree = DraftTree.root(committed[-1])
    for token in path:
        tree = tree.add_nodes(torch.tensor([len(tree) - 1]), torch.tensor([token]), torch.tensor([0.0]))
    return drafter.expand(tree, torch.tensor([len(tree) - 1]))[0]


@functools.lru_cache(maxsize=None)
def corpus_store(vocab: int = VOCAB) -> str:
    """A static automaton over a few repetitive documents (built once per session)."""
    folder = tempfile.mkdtemp(prefix="sam-store-")
    docs = [REPEAT * 2, [7, 8, 9, 10, 11, 12] * 3, [30, 2, 17, 9, 12, 30, 5, 6]]
    build(docs, list, folder, "test", vocab, separator=vocab - 1)
    return folder


# ---------------------------------------------------------------------- rows and the rule
def test_alone_the_row_continues_the_match_and_falls_back_elsewhere():
    target = TargetModel(tiny_target())
    drafter = _sam(target)
    # Committed REPEAT | root 12: the match "9 12 30 2 17 9 12" (m = 7: up to 28 tokens) first ends
    # at position 8; the four tokens after it are all the string holds.
    drafter.begin(torch.tensor(REPEAT + [12]))
    choice = drafter.choice()
    assert (choice.source, choice.match, choice.draft) == ("dynamic", 7, (30, 2, 17, 9))
    on = _rows(drafter, REPEAT + [12], [30, 2])
    assert on[17] == 0.0 and torch.isfinite(on).sum() == 1
    off = _rows(drafter, REPEAT + [12], [31])
    assert off[PAD] == pytest.approx(math.log(1e-6)) and torch.isfinite(off).sum() == 1


def test_no_match_drafts_nothing_alone():
    drafter = _sam(TargetModel(tiny_target()))
    drafter.begin(torch.tensor([1, 2, 3]))
    assert drafter.choice().draft == () and drafter.choice().match == 0


def test_the_auxiliary_drafts_where_the_match_is_short():
    target = TargetModel(tiny_target())
    samd = _sam(target, auxiliary="ngram", len_threshold=3)
    ngram = make_plugin("drafters", "ngram", target)
    short = [4, 9, 12, 30, 1, 9, 12]  # root 12 after 9: a match of 2 < 3
    assert torch.equal(_rows(samd, short, []), _rows(ngram, short, []))
    assert samd.choice().source == "auxiliary"
    assert (_rows(samd, REPEAT + [12], []), samd.choice().source)[1] == "dynamic"
    assert samd.steps_by_source["dynamic"] == 1 and samd.steps_by_source["auxiliary"] == 1


def test_the_auxiliary_drafts_only_above_auxiliary_depth():
    target = TargetModel(tiny_target())
    samd = _sam(target, auxiliary="ngram", len_threshold=50, auxiliary_depth=2)
    ngram = make_plugin("drafters", "ngram", target)
    for path in ([], [30]):  # nodes of depth 0 and 1: the auxiliary's rows
        assert torch.equal(_rows(samd, REPEAT, path), _rows(ngram, REPEAT, path))
    deep = _rows(samd, REPEAT, [30, 2])  # depth 2: the fallback row, no auxiliary forward
    assert deep[PAD] == pytest.approx(math.log(1e-6)) and torch.isfinite(deep).sum() == 1
    # One call over nodes on both sides of the limit keeps the rows in the nodes' order.
    samd.begin(torch.tensor(REPEAT))
    tree = DraftTree.root(REPEAT[-1])
    for parent, token in ((0, 30), (1, 2), (0, 31)):
        tree = tree.add_nodes(torch.tensor([parent]), torch.tensor([token]), torch.tensor([0.0]))
    nodes = torch.tensor([2, 1, 3])  # depths 2, 1, 1
    values, tokens, _ = samd.expand_top(tree, nodes, 3)
    for row, node in enumerate(nodes.tolist()):
        alone = samd.expand_top(tree, torch.tensor([node]), 3)
        assert torch.equal(values[row], alone[0][0]) and torch.equal(tokens[row], alone[1][0])
    assert torch.equal(samd.expand(tree, nodes)[0], deep)


def test_with_an_auxiliary_the_draft_starts_where_n_predicts_tokens_follow():
    """``to_anc``: the match's first occurrence leaves too few tokens, a shorter match's does not."""
    target = TargetModel(tiny_target())
    text = [5, 6, 7, 8, 1, 2, 3, 1, 2, 3, 1, 2, 3, 1, 2]
    samd = _sam(target, auxiliary="ngram", len_threshold=1, n_predicts=6)
    samd.begin(torch.tensor(text + [3]))
    # The longest match "1 2 3 1 2 3 1 2 3" ends at 13, two tokens before the end: to_anc walks up
    # to "1 2 3" (first end 7): 8 tokens follow.
    assert samd.choice().draft == (1, 2, 3, 1, 2)


def test_the_static_automaton_drafts_a_tree_of_frequent_continuations():
    target = TargetModel(tiny_target())
    drafter = _sam(target, datastore=corpus_store())
    drafter.begin(torch.tensor([1, 7, 8, 9]))  # "7 8 9" occurs 3 times in the corpus
    choice = drafter.choice()
    assert (choice.source, choice.match) == ("static", 3)
    row = _rows(drafter, [1, 7, 8, 9], [])
    assert row[10] == pytest.approx(0.0) and torch.isfinite(row).sum() == 1


@pytest.mark.parametrize("options, bad", [({"n_predicts": 0}, "n_predicts"), ({"len_bias": -1}, "len_bias"),
                                          ({"alpha": 0}, "alpha"), ({"auxiliary": 3}, "auxiliary"),
                                          ({"auxiliary": ["recycle", 3]}, "auxiliary"),
                                          ({"auxiliary_depth": 0}, "auxiliary_depth"),
                                          ({"fallback_prob": 0.0}, "fallback_prob"), ({"top_k": 0}, "top_k")])
def test_bad_options_name_the_option(options, bad):
    with pytest.raises(OptionError, match=f"'{bad}'"):
        _sam(TargetModel(tiny_target()), **options)


def test_an_auxiliarys_own_options_are_checked_as_its_own():
    with pytest.raises(OptionError, match="auxiliary of 'sam'"):
        _sam(TargetModel(tiny_target()), auxiliary=["ngram", {"max_ngram": 0}])


def test_declarations_follow_the_auxiliary():
    target = TargetModel(tiny_target())
    assert _sam(target).replay == "exact" and not _sam(target).needs_target_logits
    recycle = _sam(target, auxiliary="recycle")
    assert recycle.needs_target_logits and recycle.persistent_state
    eagle = _sam(target, auxiliary=["eagle3", {"head": random_head(target.model, "eagle3", seed=2)}])
    assert eagle.needs_target_hidden and eagle.replay == "approximate"


# ---------------------------------------------------------------------- the datastore
def test_datastore_build_kind_sam_writes_a_loadable_automaton(tmp_path):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("\n".join(json.dumps({"text": t}) for t in ["abcabcabd", "xyzabc"]) + "\n")
    out = tmp_path / "store"
    specframe.get_registry().register_commands(cli)  # as specframe's main() does: the drafters add it
    result = CliRunner().invoke(cli, ["datastore", "build", str(corpus), "--kind", "sam", "--tokenizer", "bytes:64",
                                      "--out", str(out)])
    assert result.exit_code == 0, result.output
    meta = json.loads((out / "sam.json").read_text())
    assert (meta["kind"], meta["documents"], meta["tokens"], meta["separator"]) == ("sam", 2, 15, -1)
    drafter = _sam(TargetModel(tiny_target()), datastore=str(out))
    abc = [b % 64 for b in b"qabcab"]
    drafter.begin(torch.tensor(abc))
    assert drafter.choice().source == "static" and drafter.choice().match == 5  # "abcab"


def test_a_datastore_of_a_larger_vocabulary_is_refused(tmp_path):
    build([[1, 2, 3]], list, tmp_path, "test", VOCAB + 1)
    with pytest.raises(DatastoreError, match="target's tokenizer"):
        _sam(TargetModel(tiny_target()), datastore=str(tmp_path))


def test_a_folder_without_an_automaton_says_how_to_build_one(tmp_path):
    with pytest.raises(DatastoreError, match="--kind sam"):
        _sam(TargetModel(tiny_target()), datastore=str(tmp_path))


# ---------------------------------------------------------------------- lossless
def _variants(target) -> dict[str, dict]:
    return {
        "sam": {},
        "sam+static": {"datastore": corpus_store()},
        "samd[recycle]": {"auxiliary": "recycle", "len_threshold": 2},
        "samd[ngram]+static": {"auxiliary": "ngram", "len_threshold": 2, "len_bias": 1, "datastore": corpus_store()},
        "samd[eagle3]": {"auxiliary": ["eagle3", {"head": random_head(target, "eagle3", seed=2, draft_vocab_size=40)}],
                         "len_threshold": 2},
    }


def _policy(name: str):
    if name == "chain":
        return ("chain", {"gamma": 6})
    return fixed_policy_spec(name) if is_builtin("policies", name) else name


@pytest.mark.parametrize("policy", POLICIES)
def test_greedy_lossless_with_every_policy(policy):
    model = tiny_target()
    prompts = [REPEAT, [7, 8, 9, 10, 11, 12, 7, 8, 9], [3]]
    sources = {"dynamic": 0, "static": 0, "auxiliary": 0}
    # The auxiliary held to one level: lossless too (its rows below are the fallback's).
    depth_limited = {"samd[ngram]-depth-1": {"auxiliary": "ngram", "len_threshold": 2, "auxiliary_depth": 1}}
    for name, options in {**_variants(model), **depth_limited}.items():
        target = TargetModel(model)
        drafter = _sam(target, **options)
        dec = SpecDecoder(target, drafter, make_plugin("policies", _policy(policy)), make_plugin("verifiers", "greedy"))
        for prompt in prompts:
            out = dec.generate(prompt, max_new_tokens=20, eos_token_id=None)
            assert out.tokens == greedy_by_recomputation(model, prompt, 20, None), f"{name} under {policy}"
        for source, steps in drafter.steps_by_source.items():
            sources[source] += steps
    assert all(sources.values()), f"some source never drafted: {sources}"


@pytest.mark.parametrize("policy", ["chain", "talon", "eagle"])
@pytest.mark.parametrize("verifier", ["greedy", ("sampling", {"temperature": 0.8, "seed": 1})])
@pytest.mark.parametrize("auxiliary", [None, "recycle"])
def test_a_step_reads_the_device_once(policy, verifier, auxiliary):
    """The source is chosen on the host from the automata, so the engine's one read per step holds."""
    target = TargetModel(tiny_target())
    options = {"auxiliary": auxiliary, "len_threshold": 2} if auxiliary else {}
    dec = SpecDecoder(target, _sam(target, **options), make_plugin("policies", _policy(policy)),
                      make_plugin("verifiers", verifier), strict=False)
    reads = count_step_reads(dec, REPEAT, max_new_tokens=24)
    assert reads["steps"] > 1 and reads["engine"] == reads["steps"]


def _variant_class(name: str, options: dict) -> type:
    """A conformance class for one configuration, under every built-in policy."""
    cls = type("TestConformance_" + "".join(c if c.isalnum() else "_" for c in name), (DrafterConformance,),
               {"plugin": ("sam", options), "policies": ENGINE_POLICIES,
                "__doc__": f"The conformance suite for {name}, under every built-in policy."})
    return cls


for _name, _options in _variants(tiny_target()).items():
    _cls = _variant_class(_name, _options)
    globals()[_cls.__name__] = _cls


# ---------------------------------------------------------------------- sampling, in distribution
SAMPLES = 600
V = 12


@functools.lru_cache(maxsize=None)
def _small():
    return tiny_model("llama", seed=7, vocab_size=V, hidden=16, layers=1, init_std=0.5)


def _exact_two(prompt: list[int]) -> dict[tuple[int, int], float]:
    model = _small()
    with torch.no_grad():
        first = torch.softmax(model(torch.tensor([prompt])).logits[0, -1].double(), -1)
        out = {}
        for a in range(V):
            second = torch.softmax(model(torch.tensor([prompt + [a]])).logits[0, -1].double(), -1)
            for b in range(V):
                out[(a, b)] = float(first[a] * second[b])
    return out


#: The automaton alone and with an auxiliary, each under a tree policy and a chain or a sampled
#: tree (drafting deterministic and i.i.d.): the rows the verifier divides by are the drafter's,
#: whatever shape holds them, and each case costs 4-6 s (the every-policy test is the greedy one).
SAMPLING_CASES = [("talon", None), ("sampled-tree", None), ("chain", "recycle"), ("opt-tree", "recycle")]


@pytest.mark.statistical
@pytest.mark.parametrize("policy, auxiliary", SAMPLING_CASES)
def test_sampling_emits_the_targets_distribution(policy, auxiliary):
    """The first two sampled tokens follow the target's distribution (chi-square, p >= 1e-3)
    over a prompt the automaton continues, and drafts are accepted."""
    prompt = [5, 3, 7, 5, 3, 7, 5, 3]
    options = {"auxiliary": auxiliary, "len_threshold": 3} if auxiliary else {}
    target = TargetModel(_small())
    dec = SpecDecoder(target, _sam(target, **options), make_plugin("policies", _policy(policy)),
                      make_plugin("verifiers", ("sampling", {"temperature": 1.0})))
    gen = torch.Generator().manual_seed(11)
    counts: dict[tuple[int, int], int] = {}
    accepted = 0
    for _ in range(SAMPLES):
        out = dec.generate(prompt, max_new_tokens=2, eos_token_id=None, generator=gen)
        key = (out.tokens[0], out.tokens[1])
        counts[key] = counts.get(key, 0) + 1
        accepted += out.steps[0].accepted
    p_value, _ = chi_square_pvalue(counts, _exact_two(prompt))
    assert accepted > 0, "no draft was accepted: the case would not test acceptance"
    assert p_value >= 1e-3, f"chi-square p = {p_value:.3g}"


def test_options_dataclass_declares_the_authors_defaults():
    fields = {f.name: f.default for f in dataclasses.fields(SamDrafter.Options)}
    assert (fields["n_predicts"], fields["len_threshold"], fields["len_bias"], fields["alpha"]) == (40, 5, 5, 4.0)
