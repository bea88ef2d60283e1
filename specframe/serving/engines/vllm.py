"""vLLM: an arm as ``--speculative-config`` JSON, and a ``speculative_config`` imported as an arm.

Names read from vllm-project/vllm ``vllm/config/speculative.py`` at commit
:data:`SOURCE_COMMIT` (``SpeculativeConfig``'s fields and ``SpeculativeMethod``), and the n-gram
rule from ``vllm/v1/spec_decode/ngram_proposer.py`` (commit 016e8ede): the longest suffix match
in [prompt_lookup_min, prompt_lookup_max] at its earliest occurrence, then the k tokens after it
copied (fewer near the end, none without a match). ``speculative_token_tree`` (a string of a
Python list of rank-path tuples, sorted breadth first; a chain when absent) is not a field at
that commit; it is read from releases that carry it (EAGLE proposers only).

Checked against the registry's vllm 0.34.0 (installed without dependencies on a CPU):
its ``SpeculativeConfig`` takes every exported key but ``speculative_token_tree`` (no field
there either) and constructs the model-free methods' exports (tests/test_engines.py, which
skips where vllm does not import).
"""

from __future__ import annotations

import ast
from typing import Any

from specframe.serving.engines.common import (
    ExportContext, chain_length, chain_of, fixed_shape, model_path, note_unmapped,
    option_values, policy_depth, static_paths, verifier_fidelity, verifier_name,
)
from specframe.serving.engines.fidelity import (
    Ref, APPROXIMATED, EXACT, NOT_EXPRESSIBLE, EngineError, Export, Fidelity)

ENGINE = "vllm"
SOURCE_COMMIT = "002e77c1f0ef9b19cff8b9e21cfbd6feb3d6b443"
SOURCE = f"vllm-project/vllm vllm/config/speculative.py @ {SOURCE_COMMIT[:12]}"
#: SpeculativeConfig's fields at SOURCE_COMMIT, plus speculative_token_tree (earlier releases).
FIELDS = frozenset({
    "enforce_eager", "num_speculative_tokens", "model", "method", "draft_tensor_parallel_size",
    "tensor_parallel_size", "quantization", "moe_backend", "attention_backend", "kv_cache_dtype",
    "max_model_len", "revision", "code_revision", "index_share_for_mtp_iteration",
    "disable_padded_drafter_batch", "disable_eagle_block_drop", "use_local_argmax_reduction",
    "use_heterogeneous_vocab", "prompt_lookup_max", "prompt_lookup_min", "parallel_drafting",
    "target_model_config", "target_parallel_config", "num_speculative_tokens_per_batch_size",
    "draft_model_config", "draft_parallel_config", "suffix_decoding_max_tree_depth",
    "suffix_decoding_max_cached_requests", "suffix_decoding_max_spec_factor",
    "suffix_decoding_min_token_prob", "draft_load_config", "rejection_sample_method",
    "synthetic_acceptance_rates", "synthetic_acceptance_length", "enable_adaptive_verification",
    "draft_sample_method", "dspark_draft_topk", "speculative_token_tree",
})
#: SpeculativeMethod at SOURCE_COMMIT (the MTP model types fold into "mtp").
METHODS = frozenset({"ngram", "medusa", "mlp_speculator", "draft_model", "suffix", "custom_class", "eagle",
                     "eagle3", "extract_hidden_states", "mtp", "dflash", "ngram_gpu", "dspark"})
#: Defaults at SOURCE_COMMIT that an import fills in (suffix decoding's and the n-gram window's).
SUFFIX_DEFAULTS = {"suffix_decoding_max_tree_depth": 24, "suffix_decoding_max_cached_requests": 10000,
                   "suffix_decoding_max_spec_factor": 1.0, "suffix_decoding_min_token_prob": 0.1}
NGRAM_RULE = ("vLLM's ngram copies the tokens after the earliest occurrence of the longest match; "
              "specframe's ngram takes the most frequent continuation, matching again at each drafted "
              "token, and drafts one fallback token where vLLM drafts none (the same tokens where the "
              "longest match occurs once)")
SUFFIX_RULE = ("vLLM's suffix method runs arctic-inference's SuffixDecoding, whose rules specframe's suffix "
               "follows (docs/parity.md) except the order of equally frequent candidates (specframe: the "
               "lower token id first; arctic-inference: its sibling order)")
#: Keys an import maps (anything else is refused by name).
IMPORTED = ("method", "model", "num_speculative_tokens", "prompt_lookup_min", "prompt_lookup_max",
            "speculative_token_tree", "draft_sample_method", "rejection_sample_method", *SUFFIX_DEFAULTS)
#: Methods an import maps to a specframe drafter.
IMPORTED_METHODS = {"ngram": "ngram", "draft_model": "model", "eagle": "eagle", "eagle3": "eagle3",
                    "medusa": "medusa", "suffix": "suffix"}
TREE_DRAFTERS = ("eagle", "eagle3")
#: Drafter options each mapping carries or states (others set away from their default are named).
MAPPED = {"ngram": {"max_ngram", "min_ngram", "decay"}, "model": {"model"}, "eagle": {"path", "head"},
          "eagle3": {"path", "head"}, "medusa": {"path"},
          "suffix": {"max_depth", "max_spec_tokens", "max_spec_factor", "max_spec_offset", "min_token_prob",
                     "global_tree", "max_cached_requests", "fallback_prob", "datastore"}}


def tree_string(paths: tuple[tuple[int, ...], ...] | list) -> str:
    """``speculative_token_tree``: the rank paths as a Python list of tuples, breadth first."""
    ordered = sorted((tuple(int(k) for k in p) for p in paths), key=lambda p: (len(p), p))
    return str(ordered)


def parse_tree_string(text: str) -> tuple[tuple[int, ...], ...]:
    """The rank paths of a ``speculative_token_tree`` string (refused by name when it is not one)."""
    try:
        value = ast.literal_eval(text)
        paths = tuple(tuple(int(k) for k in p) for p in value)
    except (ValueError, SyntaxError, TypeError) as err:
        raise EngineError(f"speculative_token_tree {text!r} is not a list of rank-path tuples, e.g. '[(0,), (1,), (0, 0)]'") from err
    return tuple(sorted(paths, key=lambda p: (len(p), p)))


def _drafter(arm: Any, ctx: ExportContext, settings: dict, fid: Fidelity, needs: list[str]) -> None:
    """The drafter's method and options."""
    d = arm.drafter
    o = option_values("drafters", d)
    if d.name == "ngram":
        settings.update(method="ngram", prompt_lookup_max=int(o["max_ngram"]),
                        prompt_lookup_min=int(o["min_ngram"]))
        fid.add(APPROXIMATED, NGRAM_RULE)
        if float(o["decay"]) != 1.0:
            fid.add(APPROXIMATED, f"ngram decay {o['decay']} (recency weighting) has no vLLM field")
    elif d.name == "model":
        settings.update(method="draft_model", model=model_path(o.get("model"), ctx))
        needs.append("the draft model as a transformers checkpoint sharing the target's tokenizer")
    elif d.name in ("eagle", "eagle3"):
        settings.update(method=d.name, model=model_path(o.get("path") or "", ctx))
        if o.get("path") is None:
            fid.add(NOT_EXPRESSIBLE, f"the {d.name} head is an in-memory object (option 'head'); vLLM loads a folder")
        needs.append(f"the {d.name.upper()} head folder in the official layout (config.json + weights, "
                     "as SafeAILab/EAGLE ships it); vLLM reads it as the speculative 'model'")
    elif d.name == "medusa":
        settings.update(method="medusa", model=model_path(o.get("path") or "", ctx))
        if _shares_lm_head(settings["model"]):
            fid.add(NOT_EXPRESSIBLE, "these Medusa heads share the target's output layer (shared_lm_head); "
                    "vLLM's Medusa loads one output layer per head")
        needs.append("Medusa heads in the official layout (FasterDecoding/Medusa: medusa_lm_head weights + config.json)")
    elif d.name == "suffix":
        settings.update(method="suffix", suffix_decoding_max_tree_depth=int(o["max_depth"]),
                        suffix_decoding_max_cached_requests=int(o["max_cached_requests"])
                        if o["global_tree"] else 0,
                        suffix_decoding_max_spec_factor=float(o["max_spec_factor"]),
                        suffix_decoding_min_token_prob=float(o["min_token_prob"]))
        fid.add(APPROXIMATED, SUFFIX_RULE)
        if float(o["max_spec_offset"]) != 0.0:
            fid.add(APPROXIMATED, f"suffix max_spec_offset = {o['max_spec_offset']} has no vLLM field (vLLM passes 0)")
        if float(o["fallback_prob"]) > 0.0:
            fid.add(APPROXIMATED, f"suffix fallback_prob = {o['fallback_prob']} drafts a fallback token where vLLM drafts none")
        if o.get("datastore"):
            fid.add(NOT_EXPRESSIBLE, "a suffix datastore (REST's corpus) has no vLLM field")
        needs.append("arctic-inference installed beside vLLM (the suffix method's implementation)")
    else:
        fid.add(NOT_EXPRESSIBLE, f"drafter {d.name!r} has no vLLM method (methods at {SOURCE_COMMIT[:12]}: "
                f"{', '.join(sorted(METHODS))})")


def _shares_lm_head(path: str) -> bool:
    """Whether the Medusa folder at ``path`` declares heads that share the target's output layer."""
    import json
    from pathlib import Path

    config = Path(path) / "config.json"
    try:
        return bool(json.loads(config.read_text(encoding="utf-8")).get("shared_lm_head", False))
    except (OSError, ValueError):
        return False


def _policy(arm: Any, ctx: ExportContext, settings: dict, fid: Fidelity) -> None:
    """How many tokens, and which tree."""
    p = arm.policy
    if arm.drafter.name == "suffix":
        # The suffix method drafts one path of at most num_speculative_tokens (the drafter's
        # max_spec_tokens, else its tree depth) and verifies that path.
        o = option_values("drafters", arm.drafter)
        # None reads as the tree depth (the drafter's spec_tokens); 0 is a cap of its own
        cap = int(o["max_depth"] if o["max_spec_tokens"] is None else o["max_spec_tokens"])
        if p.name == "chain":
            gamma = chain_length(p, ctx, fid)
            if gamma < cap:
                cap = gamma
        else:
            fid.add(APPROXIMATED, f"vLLM verifies the suffix method's single path; the {p.name} tree's other "
                    "branches are not drafted")
        settings["num_speculative_tokens"] = cap
        return
    if p.name == "chain":
        settings["num_speculative_tokens"] = chain_length(p, ctx, fid)
        o = p.options
        if o.get("schedule", "constant") != "constant":
            fid.add(APPROXIMATED, f"chain schedule {o['schedule']!r} changes gamma each step; vLLM drafts a fixed count")
        if o.get("confidence_stop"):
            fid.add(APPROXIMATED, "the chain's confidence stop has no vLLM field: vLLM drafts every token")
        if o.get("sample"):
            settings["draft_sample_method"] = "probabilistic"
        return
    paths = static_paths(arm, ctx, fid)
    if paths is None:
        depth = policy_depth(p)
        depth = min(depth, 8)
        fid.add(APPROXIMATED, f"the {p.name} tree adapts each step and no acceptance is measured for it "
                f"(pass --acceptance FILE from `specframe acceptance`): served as a chain of {depth}")
        settings["num_speculative_tokens"] = depth
        return
    if arm.drafter.name in TREE_DRAFTERS:
        settings["num_speculative_tokens"] = len(paths)
        settings["speculative_token_tree"] = tree_string(paths)
        fid.add(APPROXIMATED, f"speculative_token_tree is read from vLLM releases that carry it; it is not a "
                f"field at {SOURCE_COMMIT[:12]}, where a tree cannot be configured")
    else:
        depth = chain_of(paths)
        settings["num_speculative_tokens"] = depth
        fid.add(APPROXIMATED, f"vLLM drafts trees for EAGLE heads only: the {len(paths)}-node tree is served "
                f"as its top chain of {depth}")
    if p.options.get("budget") == "auto" and fixed_shape(p) is None:  # an adaptive tree sized each step
        fid.add(APPROXIMATED, "budget = 'auto' sizes each step; the fitted tree has the size the run settled on")


def export(arm: Any, ctx: ExportContext) -> Export:
    """``arm`` as vLLM's ``speculative_config``."""
    fid, settings, needs = Fidelity(), {}, []
    _drafter(arm, ctx, settings, fid, needs)
    note_unmapped(arm, ENGINE, MAPPED.get(arm.drafter.name, set()), fid)
    _policy(arm, ctx, settings, fid)
    fid.merge(verifier_fidelity(arm, ENGINE, "vLLM's rejection sampler keeps the target's distribution "
                                "(rejection_sample_method 'standard'), with its own random draws"))
    if verifier_name(arm) == "greedy":
        needs.append("greedy requests (temperature 0): the arm verifies greedily")
    return Export(ENGINE, settings, fid, needs, SOURCE)


def _int(table: dict, key: str, default: Any = None) -> Any:
    value = table.get(key, default)
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
        raise EngineError(f"speculative_config.{key} must be an integer >= 1, got {value!r}")
    return value


def import_arm(table: dict, where: str) -> tuple[Ref, Ref, Ref, Fidelity]:
    """``(drafter, policy, verifier, fidelity)`` of a ``speculative_config`` table."""
    if not isinstance(table, dict):
        raise EngineError(f"{where}: speculative_config must be a table, got {table!r}")
    for key in table:
        if key not in IMPORTED:
            known = "a vLLM field specframe does not model" if key in FIELDS else f"not a vLLM field at {SOURCE_COMMIT[:12]}"
            raise EngineError(f"{where}: speculative_config key {key!r} is {known}; supported: {', '.join(IMPORTED)}")
    method = table.get("method")
    if method is None and table.get("model") in ("ngram", "[ngram]"):
        method = "ngram"
    if method not in IMPORTED_METHODS:
        raise EngineError(f"{where}: speculative_config.method {method!r} is not supported; supported: "
                          f"{', '.join(IMPORTED_METHODS)}")
    fid = Fidelity()
    n = _int(table, "num_speculative_tokens")
    if method == "ngram":
        lo, hi = _int(table, "prompt_lookup_min"), _int(table, "prompt_lookup_max")
        lo, hi = (5, 5) if lo is None and hi is None else (lo or hi, hi or lo)
        if lo > hi:
            raise EngineError(f"{where}: prompt_lookup_min {lo} must be <= prompt_lookup_max {hi}")
        drafter = Ref("ngram", {"max_ngram": hi, "min_ngram": lo})
        fid.add(APPROXIMATED, NGRAM_RULE)
    elif method == "suffix":
        s = {k: table.get(k, v) for k, v in SUFFIX_DEFAULTS.items()}
        cached = int(s["suffix_decoding_max_cached_requests"])
        opts = {"max_depth": int(s["suffix_decoding_max_tree_depth"]),
                "max_spec_factor": float(s["suffix_decoding_max_spec_factor"]),
                "min_token_prob": float(s["suffix_decoding_min_token_prob"]), "global_tree": cached > 0}
        if cached > 0:
            opts["max_cached_requests"] = cached
        n = n or opts["max_depth"]
        opts["max_spec_tokens"] = n
        drafter = Ref("suffix", opts)
        fid.add(APPROXIMATED, SUFFIX_RULE)
    else:
        model = table.get("model")
        if not isinstance(model, str) or not model:
            raise EngineError(f"{where}: speculative_config.method {method!r} needs 'model' (the draft model or head folder)")
        key = "model" if method == "draft_model" else "path"
        drafter = Ref(IMPORTED_METHODS[method], {key: model})
    tree = table.get("speculative_token_tree")
    if tree is not None:
        if method not in TREE_DRAFTERS:
            raise EngineError(f"{where}: speculative_token_tree applies to methods {', '.join(TREE_DRAFTERS)}, not {method!r}")
        policy = Ref("static", {"choices": [list(p) for p in parse_tree_string(tree)]})
    else:
        if n is None:
            raise EngineError(f"{where}: speculative_config.num_speculative_tokens is required for method {method!r}")
        opts = {"gamma": n}
        if table.get("draft_sample_method", "greedy") == "probabilistic":
            opts["sample"] = True
        policy = Ref("chain", opts)
    sampled = table.get("draft_sample_method", "greedy")
    if sampled not in ("greedy", "probabilistic"):
        raise EngineError(f"{where}: draft_sample_method {sampled!r}; supported: greedy, probabilistic")
    rejection = table.get("rejection_sample_method", "standard")
    if rejection not in ("standard", "strict"):
        raise EngineError(f"{where}: rejection_sample_method {rejection!r} is not supported; supported: standard, strict")
    verifier = Ref("sampling", {}) if sampled == "probabilistic" else Ref("greedy", {})
    if fid.level == EXACT and sampled == "probabilistic":
        fid.add(APPROXIMATED, "sampled requests: the same target distribution, other random draws")
    return drafter, policy, verifier, fid
