"""REST datastores: the suffix array and its lookup against brute force, the build command, and
the ``suffix`` drafter retrieving from one, losslessly."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from specframe.cli import cli
from specframe.decode.engine import SpecDecoder, make_plugin
from specframe.drafters.datastore import (MAX_OCCURRENCES, SEPARATOR, Datastore, DatastoreError, build, load, row_text,
                                          suffix_array)
from specframe.models.target import TargetModel
from specframe.plugins import get_registry
from specframe.testing.conformance import DrafterConformance
from specframe.testing.fixtures import SUFFIX_EMPTY_ROWS, VOCAB, fixed_policy_spec, tiny_target
from specframe.testing.harness import greedy_by_recomputation
from specframe.testing.profiles import profile_examples

EXAMPLES = profile_examples()
docs_strategy = st.lists(st.lists(st.integers(0, 5), min_size=1, max_size=30), min_size=1, max_size=5)


def brute_order(tokens: list[int], depth: int) -> list[int]:
    """Positions sorted by their next ``depth`` tokens (past the end first), ties by position."""
    def key(p: int) -> list[int]:
        return tokens[p : p + depth]
    return sorted(range(len(tokens)), key=lambda p: (key(p), p))


def brute_longest(docs: list[list[int]], query: list[int], depth: int, min_match: int) -> tuple[int, dict]:
    """The longest suffix of ``query`` (<= depth) followed by a token inside some document, and
    those tokens' counts."""
    for m in range(min(depth, len(query)), min_match - 1, -1):
        if m == 0:
            break
        pattern, counts = query[-m:], {}
        for doc in docs:
            for i in range(len(doc) - m):
                if doc[i : i + m] == pattern:
                    counts[doc[i + m]] = counts.get(doc[i + m], 0) + 1
        if counts:
            return m, counts
    return 0, {}


@settings(max_examples=EXAMPLES * 3)
@given(tokens=st.lists(st.integers(-1, 4), min_size=1, max_size=60), depth=st.integers(1, 9))
def test_suffix_array_sorts_by_the_first_depth_tokens(tokens, depth):
    # Python's list order puts a shorter prefix first, as the array's "past the end" does; the
    # doubling sorts by the next power of two of tokens.
    assert suffix_array(np.array(tokens), depth).tolist() == brute_order(tokens, 1 << (depth - 1).bit_length())


@settings(max_examples=EXAMPLES * 3)
@given(docs=docs_strategy, query=st.lists(st.integers(0, 5), min_size=1, max_size=12),
       depth=st.integers(1, 8), min_match=st.integers(1, 3))
def test_longest_matches_brute_force(tmp_path_factory, docs, query, depth, min_match):
    out = tmp_path_factory.mktemp("ds")
    build(docs, list, out, "ids", vocab_size=6, depth=depth)
    assert Datastore(out).longest(query, min_match) == brute_longest(docs, query, depth, min_match)


def test_a_lookup_counts_a_bounded_sample_of_a_frequent_match(tmp_path):
    docs = [[1, 2] * (MAX_OCCURRENCES + 10)]
    build(docs, list, tmp_path, "ids", vocab_size=3, depth=4)
    m, counts = Datastore(tmp_path).longest([1], 1)
    assert m == 1 and counts == {2: MAX_OCCURRENCES}


def test_files_and_layout(tmp_path):
    meta = build([[3, 4, 5], [6]], list, tmp_path, "ids", vocab_size=8, depth=2)
    assert meta["tokens"] == 4 and meta["documents"] == 2 and meta["bytes"] > 0
    tokens = np.load(tmp_path / "tokens.npy")
    assert tokens.tolist() == [6, SEPARATOR, 5, 4, 3]  # reversed, documents separated
    assert np.load(tmp_path / "sa.npy").dtype == np.int32


def test_refusals_name_the_fix(tmp_path):
    with pytest.raises(DatastoreError, match="no datastore.json"):
        Datastore(tmp_path)
    build([[1, 2, 3]], list, tmp_path / "ds", "ids", vocab_size=100)
    with pytest.raises(DatastoreError, match="100 tokens .* the target has 64"):
        load(tmp_path / "ds", 64)
    with pytest.raises(DatastoreError, match="no text"):
        build([[]], list, tmp_path / "empty", "ids", vocab_size=4)
    with pytest.raises(DatastoreError, match="vocabulary size 4"):
        build([[7]], list, tmp_path / "big", "ids", vocab_size=4)


def test_build_command_reads_text_jsonl_and_folders(tmp_path):
    (tmp_path / "a.txt").write_text("hello world")
    (tmp_path / "b.jsonl").write_text(json.dumps({"text": "abc"}) + "\n" + json.dumps({"turns": ["de", "f"]}) + "\n")
    (tmp_path / "dir").mkdir()
    (tmp_path / "dir" / "c.md").write_text("xyz")
    get_registry().register_commands(cli)  # as specframe's main() does: the drafters add the command
    result = CliRunner().invoke(cli, ["datastore", "build", str(tmp_path / "a.txt"), str(tmp_path / "b.jsonl"),
                                      str(tmp_path / "dir"), "--tokenizer", "bytes", "--out", str(tmp_path / "ds")])
    assert result.exit_code == 0, result.output
    meta = json.loads((tmp_path / "ds" / "datastore.json").read_text())
    assert meta["documents"] == 4 and meta["tokens"] == len("hello world") + 3 + len("de\nf") + 3
    assert "bytes/token" in result.output
    assert Datastore(tmp_path / "ds").longest(list(b"hello wor"), 1) == (9, {ord("l"): 1})


# ---------------------------------------------------------------------- the drafter
def continuation(prompt: list[int], n: int) -> list[int]:
    return greedy_by_recomputation(tiny_target(), prompt, n, None)


@pytest.mark.parametrize("policy", ["chain", ("talon", {"budget": 6}), ("eagle", {"budget": 8})])
def test_suffix_with_a_datastore_is_lossless_and_retrieves(tmp_path, policy):
    """A corpus that holds the target's own continuations: the datastore drafts them (tau > 1
    from the first request, where the request and global indexes know nothing of them), and the
    output stays greedy decoding."""
    prompts = [[3, 17, 40, 2, 9], [11, 3, 3, 8, 1], [5, 6, 7]]
    build([p + continuation(p, 24) for p in prompts], list, tmp_path, "ids", vocab_size=VOCAB)
    target = TargetModel(tiny_target())
    with_store = SpecDecoder(target, make_plugin("drafters", ("suffix", {"datastore": str(tmp_path), "global_tree": False}),
                                                 target), make_plugin("policies", policy), make_plugin("verifiers", "greedy"))
    without = SpecDecoder(target, make_plugin("drafters", ("suffix", {"global_tree": False}), target),
                          make_plugin("policies", policy), make_plugin("verifiers", "greedy"))
    for prompt in prompts:
        out = with_store.generate(prompt, max_new_tokens=16, eos_token_id=None)
        assert out.tokens == continuation(prompt, 16)
        assert out.tau > without.generate(prompt, max_new_tokens=16, eos_token_id=None).tau


def test_the_datastore_option_is_checked(tmp_path):
    target = TargetModel(tiny_target())
    with pytest.raises(ValueError, match="datastore"):
        make_plugin("drafters", ("suffix", {"datastore": 3}), target)
    with pytest.raises(DatastoreError, match="no datastore.json"):
        make_plugin("drafters", ("suffix", {"datastore": str(tmp_path)}), target)


POLICIES = get_registry().names("policies")


@pytest.mark.parametrize("policy", POLICIES)
@settings(max_examples=max(2, EXAMPLES // 3), deadline=None)
@given(prompt=st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=8),
       noise=st.lists(st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=20), max_size=3),
       keep=st.integers(0, 12))
def test_every_policy_with_a_datastore_is_lossless(tmp_path_factory, policy, prompt, noise, keep):
    """A generated corpus (random documents, and the prompt followed by the first ``keep`` tokens
    of its greedy continuation): whatever the datastore proposes, the output is greedy decoding."""
    out_dir = tmp_path_factory.mktemp("ds")
    build([*noise, prompt + continuation(prompt, keep)] if keep else [*noise, prompt], list, out_dir, "ids",
          vocab_size=VOCAB, depth=6)
    target = TargetModel(tiny_target())
    spec = fixed_policy_spec(policy)
    dec = SpecDecoder(target, make_plugin("drafters", ("suffix", {"datastore": str(out_dir), "max_match": 6}), target),
                      make_plugin("policies", spec), make_plugin("verifiers", "greedy"))
    assert dec.generate(prompt, max_new_tokens=10, eos_token_id=None).tokens == continuation(prompt, 10)


# ---------------------------------------------------------------------- answers tied to the datastore
DATASTORE_RUN = """
name = "ds"
max_new_tokens = 6
warmup = 0
stop_at_eos = false
threads = 1
{pair}
[[arm]]
name = "retrieve"
drafter = "suffix"
drafter_options = {{ datastore = "{ds}", global_tree = false }}
policy = "chain"

[data]
path = "{prompts}"

[output]
dir = "{out}"
"""


def test_answers_are_tied_to_the_datastore_s_content(tmp_path, monkeypatch):
    """A rebuilt datastore with other content makes the arm a changed one (refused, naming the
    option); the same corpus rebuilt is the same folder and resumes; --fresh starts over."""
    from specframe.errors import ExperimentError
    from specframe.experiments.experiment import run_experiment
    from specframe.testing.fixtures import TINY_PAIR_TOML

    monkeypatch.chdir(tmp_path)
    (tmp_path / "q.jsonl").write_text("".join(json.dumps({"question_id": i, "category": "a", "turns": [f"ab {i}"]}) + "\n"
                                              for i in range(2)))
    config = tmp_path / "ds.toml"
    config.write_text(DATASTORE_RUN.format(pair=TINY_PAIR_TOML, ds="./store", prompts=tmp_path / "q.jsonl",
                                           out=tmp_path / "run"))
    build([[1, 2, 3, 4]], list, tmp_path / "store", "ids", vocab_size=64)
    assert run_experiment(config, progress=False).computed == 2
    build([[1, 2, 3, 4]], list, tmp_path / "store", "ids", vocab_size=64)  # same corpus: same folder
    assert run_experiment(config, progress=False).computed == 0
    build([[5, 6, 7]], list, tmp_path / "store", "ids", vocab_size=64)
    with pytest.raises(ExperimentError, match=r"arm 'retrieve': the files its option drafter.datastore names changed"):
        run_experiment(config, progress=False)
    assert run_experiment(config, progress=False, fresh=True).computed == 2


class TestSuffixWithDatastoreConformance(DrafterConformance):
    """``suffix`` retrieving from a datastore too (a corpus of the tiny target's own greedy
    continuations, so that the datastore's rows are the ones drafted)."""

    plugin = "suffix"
    expected_failures = {"test_expand_rows_are_log_distributions": SUFFIX_EMPTY_ROWS}

    def make_drafter(self, target: TargetModel):
        return make_plugin("drafters", ("suffix", {"datastore": str(conformance_store()), "max_depth": 12}), target)


@functools.cache
def conformance_store() -> Path:
    """One datastore per test process, in a temporary folder removed at exit."""
    import atexit
    import shutil
    import tempfile

    store = Path(tempfile.mkdtemp(prefix="specframe-conformance-store-"))
    atexit.register(shutil.rmtree, store, True)
    prompts = [[3, 17, 40, 2, 9], [11, 3, 3, 8, 1], [5, 6, 7], [1, 2, 3, 4]]
    build([p + continuation(p, 20) for p in prompts], list, store, "ids", vocab_size=VOCAB)
    return store


@pytest.mark.parametrize("row, text", [
    ({"text": "abc", "turns": ["x"]}, "abc"),
    ({"turns": ["q1", "q2"], "answer": "a"}, "q1\nq2\na"),
    ({"turns": ["q"], "answers": ["a1", "a2"]}, "q\na1\na2"),
    ({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}, "hi\nyo"),
    ({"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "yo"}]}, "hi\nyo"),
    ({"other": 1}, ""),
])
def test_a_jsonl_row_gives_its_whole_conversation(row, text):
    assert row_text(row) == text
