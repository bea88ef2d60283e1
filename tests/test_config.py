"""Experiment files: bad configs fail before any model loads, naming the problem; sweeps expand."""

from __future__ import annotations

import json
import textwrap

import pytest

import specframe.plugins as plugins
from specframe.experiments.config import ConfigError, load_config, slugify
from specframe.experiments.data import ByteTokenizer, DataError, PromptEncoder, load_questions
from specframe.experiments.experiment import run_experiment
from specframe.interfaces import Drafter

BASE = """
max_new_tokens = 8
stop_at_eos = false

[target]
model = "random:llama"
dtype = "float64"
random = {{ vocab_size = 64, hidden = 32, layers = 2, seed = 0 }}

[models.draft]
model = "perturbed:target"
random = {{ noise = 0.05, seed = 1 }}

[drafter]
name = "model"
options = {{ model = "draft" }}

{arms}

[data]
path = "{data}"
{data_extra}
"""

AR_AND_CHAIN = """
[[arm]]
baseline = "autoregressive"

[[arm]]
policy = "chain"
policy_options = { gamma = 3 }
"""


@pytest.fixture
def prompts(tmp_path):
    path = tmp_path / "prompts.jsonl"
    rows = [{"question_id": i, "category": "ab"[i % 2], "turns": [f"prompt number {i}"]} for i in range(5)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture(autouse=True)
def no_model_loads(monkeypatch):
    """Any model construction during these tests is a failure: validation must come first."""
    import transformers

    import specframe.models.synthetic as models

    def forbidden(*args, **kwargs):
        raise AssertionError("a model was loaded before the config was validated")

    monkeypatch.setattr(models, "tiny_model", forbidden)
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", forbidden)
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_config", forbidden)


def write(tmp_path, arms=AR_AND_CHAIN, data="prompts.jsonl", data_extra="", top="", base=BASE):
    path = tmp_path / "exp.toml"
    path.write_text(top + textwrap.dedent(base.format(arms=arms, data=data, data_extra=data_extra)))
    return path


def fails(path, *fragments):
    """Loading AND running the config both raise ConfigError naming every fragment."""
    for attempt in (lambda: load_config(path), lambda: run_experiment(path, progress=False)):
        with pytest.raises(ConfigError) as err:
            attempt()
        for fragment in fragments:
            assert fragment in str(err.value), f"{fragment!r} not in: {err.value}"
    return str(err.value)


# ---------------------------------------------------------------------- valid files
def test_valid_config_parses_with_defaults(tmp_path, prompts):
    cfg = load_config(write(tmp_path))
    assert [a.name for a in cfg.arms] == ["autoregressive", "chain"]
    chain = cfg.arm("chain")
    assert chain.policy.options == {"gamma": 3}
    assert chain.drafter.name == "model" and chain.drafter.options == {"model": "draft"}
    assert chain.verifier.name == "greedy"
    assert cfg.data.path == tmp_path / "prompts.jsonl"  # relative to the config file
    assert cfg.output.dir == tmp_path / "runs" / "experiment"
    assert (cfg.max_new_tokens, cfg.warmup, cfg.repeats, cfg.stop_at_eos) == (8, 1, 1, False)


def test_arm_drafter_options_merge_over_defaults(tmp_path, prompts):
    arms = AR_AND_CHAIN + """
[[arm]]
name = "eager-draft"
policy = "chain"
drafter_options = { attn_implementation = "eager" }
"""
    arm = load_config(write(tmp_path, arms=arms)).arm("eager-draft")
    assert arm.drafter.options == {"model": "draft", "attn_implementation": "eager"}


def test_other_drafter_is_named_drafter_plus_policy_and_skips_default_options(tmp_path, prompts, monkeypatch):
    class Dummy(Drafter):
        name = "dummy-drafter"

        def expand(self, tree, nodes):  # pragma: no cover - never run
            raise NotImplementedError

    class Plugin:
        @plugins.hookimpl
        def register_drafters(self, register):
            register(Dummy)

    registry = plugins.Registry()
    registry.register(Plugin(), dist="test")
    monkeypatch.setattr(plugins, "_registry", registry)
    arms = AR_AND_CHAIN + '\n[[arm]]\npolicy = "chain"\ndrafter = "dummy-drafter"\n'
    arm = load_config(write(tmp_path, arms=arms)).arms[-1]
    assert arm.name == "dummy-drafter+chain"
    assert arm.drafter.options == {}


# ---------------------------------------------------------------------- unknown keys
@pytest.mark.parametrize("where, edit, bad, valid", [
    ("top", lambda s: "max_new_token = 5\n" + s, "max_new_token", "max_new_tokens"),
    ("target", lambda s: s.replace('dtype = "float64"', 'dtyp = "float64"'), "dtyp", "attn_implementation"),
    ("target.random", lambda s: s.replace("layers = 2,", "layer = 2,"), "layer", "layers"),
    ("drafter", lambda s: s.replace('name = "model"', 'name = "model"\nopts = 1'), "opts", "options"),
    ("data", lambda s: s + "\nlimt = 3\n", "limt", "limit"),
    ("output", lambda s: s + "\n[output]\ndirectory = 'x'\n", "directory", "dir"),
    ("arm", lambda s: s.replace("policy_options =", "policy_option ="), "policy_option", "policy_options"),
])
def test_unknown_key_names_it_and_the_valid_ones(tmp_path, prompts, where, edit, bad, valid):
    path = write(tmp_path)
    path.write_text(edit(path.read_text()))
    msg = fails(path, repr(bad), "valid keys", valid)
    assert "unknown key" in msg


def test_unknown_plugin_lists_the_available_ones(tmp_path, prompts):
    arms = AR_AND_CHAIN.replace('policy = "chain"', 'policy = "no-such-policy"')
    fails(write(tmp_path, arms=arms), "no-such-policy", "available policies", "chain")


def test_unknown_verifier_and_drafter(tmp_path, prompts):
    fails(write(tmp_path, arms=AR_AND_CHAIN + '\n[[arm]]\npolicy = "chain"\nverifier = "nope-ver"\n'),
          "unknown verifier 'nope-ver'", "greedy")
    fails(write(tmp_path, arms=AR_AND_CHAIN + '\n[[arm]]\npolicy = "chain"\ndrafter = "nope-dr"\n'),
          "unknown drafter 'nope-dr'", "model")


def test_unknown_baseline_and_plugin_option(tmp_path, prompts):
    fails(write(tmp_path, arms='[[arm]]\nbaseline = "beam-search"\n'), "beam-search", "autoregressive", "hf-assisted")
    fails(write(tmp_path, arms='[[arm]]\npolicy = "chain"\npolicy_options = { gama = 3 }\n'),
          "'gama'", "gamma")
    fails(write(tmp_path, arms='[[arm]]\nbaseline = "hf-prompt-lookup"\nbaseline_options = { tokens = 3 }\n'),
          "'tokens'", "prompt_lookup_num_tokens")


def test_bad_option_value_names_the_option(tmp_path, prompts):
    fails(write(tmp_path, arms='[[arm]]\npolicy = "chain"\npolicy_options = { gamma = 0 }\n'), "gamma", ">= 1")


# ---------------------------------------------------------------------- data
def test_missing_data_file(tmp_path):
    fails(write(tmp_path, data="nowhere.jsonl"), "nowhere.jsonl", "does not exist")


def test_empty_dataset(tmp_path):
    (tmp_path / "empty.jsonl").write_text("\n")
    fails(write(tmp_path, data="empty.jsonl"), "empty")


def test_category_filter_matching_nothing_is_an_empty_dataset(tmp_path, prompts):
    fails(write(tmp_path, data_extra='category = "zzz"'), "empty", "zzz")


def test_malformed_data_line_names_file_and_line(tmp_path):
    (tmp_path / "bad.jsonl").write_text('{"prompt": "ok"}\n{"text": "no prompt"}\n')
    fails(write(tmp_path, data="bad.jsonl"), "bad.jsonl:2", "turns", "prompt")


# ---------------------------------------------------------------------- arms
def test_duplicated_arm_names(tmp_path, prompts):
    arms = AR_AND_CHAIN + '\n[[arm]]\npolicy = "chain"\n'
    fails(write(tmp_path, arms=arms), "'chain'", "duplicated")


def test_explicitly_duplicated_names(tmp_path, prompts):
    arms = '[[arm]]\nname = "x"\nbaseline = "autoregressive"\n[[arm]]\nname = "x"\npolicy = "chain"\n'
    fails(write(tmp_path, arms=arms), "'x'", "duplicated")


def test_arm_needs_policy_or_baseline_not_both(tmp_path, prompts):
    fails(write(tmp_path, arms='[[arm]]\nname = "x"\n'), "'policy'", "'baseline'")
    fails(write(tmp_path, arms='[[arm]]\nbaseline = "autoregressive"\npolicy = "chain"\n'), "baseline arm takes no policy")


def test_hf_assisted_needs_an_assistant(tmp_path, prompts):
    path = write(tmp_path, arms='[[arm]]\nbaseline = "hf-assisted"\n')
    path.write_text(path.read_text().replace('[drafter]\nname = "model"\noptions = { model = "draft" }\n', ""))
    fails(path, "hf-assisted", "assistant")


def test_missing_model_path(tmp_path, prompts):
    path = write(tmp_path)
    path.write_text(path.read_text().replace('model = "random:llama"', 'model = "./no/such/model"')
                    .replace("random = { vocab_size = 64, hidden = 32, layers = 2, seed = 0 }", ""))
    fails(path, "no/such/model", "does not exist")


def test_perturbed_of_unknown_alias(tmp_path, prompts):
    path = write(tmp_path)
    path.write_text(path.read_text().replace("perturbed:target", "perturbed:ghost"))
    fails(path, "ghost", "declared")


# ---------------------------------------------------------------------- sweeps
def test_sweep_expands_cartesian_product_named_after_values(tmp_path, prompts):
    arms = '[[arm]]\npolicy = "chain"\nsweep.gamma = [1, 2, 3]\nsweep.schedule = ["constant", "heuristic"]\n'
    cfg = load_config(write(tmp_path, arms=arms))
    names = [a.name for a in cfg.arms]
    assert len(names) == 6
    assert names[0] == "chain[gamma=1,schedule=constant]"
    assert names[-1] == "chain[gamma=3,schedule=heuristic]"
    expected = {(g, s) for g in (1, 2, 3) for s in ("constant", "heuristic")}
    assert {(a.policy.options["gamma"], a.policy.options["schedule"]) for a in cfg.arms} == expected
    assert all(a.sweep == {"gamma": a.policy.options["gamma"], "schedule": a.policy.options["schedule"]}
               for a in cfg.arms)
    assert len({slugify(n) for n in names}) == 6


def test_sweep_keeps_fixed_options_and_accepts_scoped_keys(tmp_path, prompts):
    arms = ('[[arm]]\nname = "c"\npolicy = "chain"\npolicy_options = { max_gamma = 40 }\n'
            'sweep."policy.gamma" = [2, 4]\n')
    cfg = load_config(write(tmp_path, arms=arms))
    assert [a.name for a in cfg.arms] == ["c[gamma=2]", "c[gamma=4]"]
    assert [a.policy.options for a in cfg.arms] == [{"max_gamma": 40, "gamma": 2}, {"max_gamma": 40, "gamma": 4}]


def test_sweep_over_baseline_options(tmp_path, prompts):
    arms = '[[arm]]\nbaseline = "hf-prompt-lookup"\nsweep.prompt_lookup_num_tokens = [3, 10]\n'
    cfg = load_config(write(tmp_path, arms=arms))
    assert [a.baseline_options for a in cfg.arms] == [{"prompt_lookup_num_tokens": 3}, {"prompt_lookup_num_tokens": 10}]


def test_bad_sweeps(tmp_path, prompts):
    fails(write(tmp_path, arms='[[arm]]\npolicy = "chain"\nsweep.gamm = [1, 2]\n'), "'gamm'", "policy.gamma")
    fails(write(tmp_path, arms='[[arm]]\npolicy = "chain"\nsweep.gamma = []\n'), "sweep.gamma", "non-empty list")
    fails(write(tmp_path, arms='[[arm]]\npolicy = "chain"\nsweep.gamma = [2, 0]\n'), "chain[gamma=0]", "gamma")


def test_sweep_name_clashing_with_explicit_arm(tmp_path, prompts):
    arms = ('[[arm]]\npolicy = "chain"\nsweep.gamma = [2, 3]\n'
            '[[arm]]\nname = "chain[gamma=3]"\npolicy = "chain"\n')
    fails(write(tmp_path, arms=arms), "chain[gamma=3]", "duplicated")


# ---------------------------------------------------------------------- data loader
def test_load_questions_formats_filter_limit(tmp_path):
    path = tmp_path / "q.jsonl"
    path.write_text(
        '{"question_id": "a", "category": "x", "turns": ["t1", "t2"]}\n\n'
        '{"prompt": "plain"}\n'
        '{"question_id": 7, "category": "y", "turns": ["t3"]}\n'
    )
    qs = load_questions(path)
    assert [q.question_id for q in qs] == ["a", 3, 7]  # plain prompt: id = line number
    assert qs[0].turns == ("t1", "t2") and qs[1].turns == ("plain",) and qs[1].category == "default"
    assert [q.question_id for q in load_questions(path, category=["y", "default"])] == [3, 7]
    assert [q.question_id for q in load_questions(path, limit=1)] == ["a"]


def test_duplicate_question_ids_rejected(tmp_path):
    path = tmp_path / "q.jsonl"
    path.write_text('{"question_id": 1, "turns": ["a"]}\n{"question_id": 1, "turns": ["b"]}\n')
    with pytest.raises(DataError, match="question_id 1 appears twice"):
        load_questions(path)


def test_prompt_encoder_multi_turn_concatenates_context():
    tok = ByteTokenizer(64)
    enc = PromptEncoder(tok)
    first = enc.encode(["ab", "cd"], [], None)
    assert first == [ord("a") % 64, ord("b") % 64]
    second = enc.encode(["ab", "cd"], [[5, 6]], first)
    assert second == first + [5, 6] + [ord("c") % 64, ord("d") % 64]


def test_chat_template_without_template_is_an_error():
    with pytest.raises(DataError, match="chat_template"):
        PromptEncoder(ByteTokenizer(64), chat_template=True)


def test_documented_full_example_is_valid(tmp_path):
    """docs/experiments.md's every-key example parses (shipped models swapped for random ones)."""
    from pathlib import Path

    doc = (Path(__file__).resolve().parent.parent / "docs" / "experiments.md").read_text()
    block = doc.split("## Full example", 1)[1].split("```toml\n", 1)[1].split("```", 1)[0]
    block = (block.replace('model = "demo-target"', 'model = "random:llama"\nrandom = { vocab_size = 64 }')
             .replace('tokenizer = "demo-target"', 'tokenizer = "bytes"')
             .replace('model = "demo-draft"', 'model = "perturbed:target"'))
    (tmp_path / "prompts").mkdir()
    rows = [{"question_id": i, "category": c, "turns": ["x"]} for i, c in enumerate(["asyncio", "base64", "zlib"])]
    (tmp_path / "prompts" / "code.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "exp.toml").write_text(block)
    cfg = load_config(tmp_path / "exp.toml")
    names = [a.name for a in cfg.arms]
    assert names[:4] == ["ar", "hf-assisted", "hf-prompt-lookup", "eagle"]
    assert len(names) == 4 + 6 + 1 and "ngram+talon[mu=0.01,budget=32]" in names
    assert cfg.arm("vllm-ngram").imported["engine"] == "vllm" and cfg.arm("vllm-ngram").drafter.name == "ngram"
    assert cfg.arm("hf-assisted").baseline_options["num_assistant_tokens"] == 5
    assert (cfg.repeats, cfg.threads, cfg.data.limit, cfg.output.trees_per_answer) == (3, 1, 20, 2)
