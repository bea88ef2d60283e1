"""llama.cpp: an arm as ``llama-server`` flags, and such flags imported as an arm.

Names read from ggml-org/llama.cpp ``common/arg.cpp`` at commit :data:`SOURCE_COMMIT`: the
draft model ``--spec-draft-model`` (aliases ``-md``, ``--model-draft``), ``--spec-draft-n-max``,
``--spec-draft-n-min``, ``--spec-draft-p-min`` (alias ``--draft-p-min``), ``--spec-type``
(``eagle3``, ``draft-mtp``, ``dflash``, and the n-gram types whose options are
``--spec-ngram-simple-size-n/-size-m/-min-hits`` and ``--spec-ngram-mod-n-min/-n-max/-n-match``).
``--draft-max``/``--draft-min`` are removed at that commit. llama.cpp drafts chains; a draft
stops before a token whose draft probability is below ``p_min`` (that token is not drafted).
"""

from __future__ import annotations

from typing import Any

from specframe.serving.engines.common import (
    ExportContext, chain_length, chain_of, model_path, note_unmapped, option_values, policy_depth,
    static_paths, verifier_fidelity, verifier_name,
)
from specframe.serving.engines.fidelity import (
    Ref, APPROXIMATED, NOT_EXPRESSIBLE, EngineError, Export, Fidelity)

ENGINE = "llamacpp"
SOURCE_COMMIT = "0017d6fb63f9590e791a7562b276148f7bd5b7fc"
SOURCE = f"ggml-org/llama.cpp common/arg.cpp @ {SOURCE_COMMIT[:12]}"
#: Drafter options the mapping carries (others set away from their default are named).
MAPPED = {"model": {"model"}, "eagle3": {"path"}, "ngram": {"max_ngram"}}
#: Speculative flags at SOURCE_COMMIT (long names, dashes as underscores).
FLAGS = frozenset({
    "spec_draft_model", "spec_draft_n_max", "spec_draft_n_min", "spec_draft_p_min", "spec_draft_p_split",
    "spec_type", "spec_draft_hf", "spec_draft_ngl", "spec_draft_device", "spec_draft_threads",
    "spec_ngram_simple_size_n", "spec_ngram_simple_size_m", "spec_ngram_simple_min_hits",
    "spec_ngram_mod_n_min", "spec_ngram_mod_n_max", "spec_ngram_mod_n_match",
    "spec_ngram_map_k_size_n", "spec_ngram_map_k_size_m", "spec_ngram_map_k_min_hits",
})
ALIASES = {"md": "spec_draft_model", "model_draft": "spec_draft_model", "draft_p_min": "spec_draft_p_min"}
REMOVED = {"draft_max": "spec_draft_n_max", "draft_n": "spec_draft_n_max", "draft": "spec_draft_n_max",
           "draft_min": "spec_draft_n_min", "draft_n_min": "spec_draft_n_min"}
IMPORTED = ("spec_draft_model", "spec_draft_n_max", "spec_draft_n_min", "spec_draft_p_min", "spec_type",
            "spec_ngram_simple_size_n", "spec_ngram_simple_size_m")
NGRAM_RULE = ("llama.cpp's ngram-simple looks up a fixed n-gram of size_n and drafts size_m tokens; "
              "specframe's ngram matches the longest suffix in [min_ngram, max_ngram] and drafts its most "
              "frequent continuation")
STOP_RULE = ("llama.cpp stops a draft before a token below p_min; specframe's confidence stop keeps that "
             "token and stops after it")


def export(arm: Any, ctx: ExportContext) -> Export:
    """``arm`` as llama-server flags."""
    fid, settings, needs = Fidelity(), {}, []
    p, d = arm.policy, arm.drafter
    if p.name == "chain":
        gamma = chain_length(p, ctx, fid)
        if p.options.get("schedule", "constant") != "constant":
            fid.add(APPROXIMATED, f"chain schedule {p.options['schedule']!r} changes gamma each step; llama.cpp drafts up to n_max")
    else:
        paths = static_paths(arm, ctx, fid)
        gamma = chain_of(paths) if paths else policy_depth(p)
        fid.add(APPROXIMATED, f"llama.cpp drafts chains: the {p.name} tree is served as a chain of {gamma}")
    if d.name in ("model", "eagle3"):
        option = "model" if d.name == "model" else "path"
        if d.name == "eagle3":
            settings["spec_type"] = "eagle3"
            fid.add(APPROXIMATED, "llama.cpp's eagle3 type is read from arg.cpp only; its drafting is not checked against specframe's")
            needs.append("the EAGLE-3 head converted to llama.cpp's GGUF sidecar")
        else:
            needs.append("the draft model converted to GGUF (llama.cpp's convert_hf_to_gguf.py), same tokenizer as the target")
        settings["spec_draft_model"] = model_path(d.options.get(option) or "", ctx)
        settings["spec_draft_n_max"] = gamma
        settings["spec_draft_n_min"] = 0
        if p.name == "chain" and p.options.get("confidence_stop"):
            settings["spec_draft_p_min"] = float(option_values("policies", p)["confidence_threshold"])
            fid.add(APPROXIMATED, STOP_RULE)
        else:
            settings["spec_draft_p_min"] = 0.0
    elif d.name == "ngram":
        settings.update(spec_type="ngram-simple", spec_ngram_simple_size_n=int(option_values("drafters", d)["max_ngram"]),
                        spec_ngram_simple_size_m=gamma)
        fid.add(APPROXIMATED, NGRAM_RULE)
    else:
        fid.add(NOT_EXPRESSIBLE, f"drafter {d.name!r} has no llama.cpp speculative type")
    note_unmapped(arm, ENGINE, MAPPED.get(arm.drafter.name, set()), fid)
    fid.merge(verifier_fidelity(arm, ENGINE, "llama.cpp samples its own tokens and accepts a draft only where they agree"))
    if verifier_name(arm) == "greedy":
        needs.append("greedy sampling (--temp 0): the arm verifies greedily")
    return Export(ENGINE, settings, fid, needs, SOURCE)


def normalise(table: dict, where: str) -> dict:
    """Keys as long flag names with underscores (``--spec-draft-n-max`` -> ``spec_draft_n_max``)."""
    out = {}
    for key, value in table.items():
        name = str(key).lstrip("-").replace("-", "_")
        if name in REMOVED:
            raise EngineError(f"{where}: llama.cpp flag {key!r} is removed at {SOURCE_COMMIT[:12]}; use {REMOVED[name]}")
        out[ALIASES.get(name, name)] = value
    return out


def import_arm(table: dict, where: str) -> tuple[Ref, Ref, Ref, Fidelity]:
    """``(drafter, policy, verifier, fidelity)`` of llama-server flags."""
    if not isinstance(table, dict):
        raise EngineError(f"{where}: args must be a table, got {table!r}")
    table = normalise(table, where)
    for key in table:
        if key not in IMPORTED:
            known = "a llama.cpp flag specframe does not model" if key in FLAGS else f"not a llama.cpp speculative flag at {SOURCE_COMMIT[:12]}"
            raise EngineError(f"{where}: args key {key!r} is {known}; supported: {', '.join(IMPORTED)}")
    fid = Fidelity()
    kind = table.get("spec_type")
    if kind == "ngram-simple":
        size_n, size_m = int(table.get("spec_ngram_simple_size_n", 3)), int(table.get("spec_ngram_simple_size_m", 8))
        fid.add(APPROXIMATED, NGRAM_RULE)
        return (Ref("ngram", {"max_ngram": size_n, "min_ngram": size_n}), Ref("chain", {"gamma": size_m}),
                Ref("greedy", {}), fid)
    if kind not in (None, "eagle3"):
        raise EngineError(f"{where}: spec_type {kind!r} is not supported; supported: eagle3, ngram-simple (or a draft model alone)")
    path = table.get("spec_draft_model")
    if not isinstance(path, str) or not path:
        raise EngineError(f"{where}: args need spec_draft_model (the draft model, or with spec_type eagle3 the head)")
    gamma = table.get("spec_draft_n_max")
    if isinstance(gamma, bool) or not isinstance(gamma, int) or gamma < 1:
        raise EngineError(f"{where}: spec_draft_n_max must be an integer >= 1, got {gamma!r}")
    if int(table.get("spec_draft_n_min", 0)) > 0:
        fid.add(APPROXIMATED, f"spec_draft_n_min {table['spec_draft_n_min']}: specframe has no minimum draft length")
    chain: dict = {"gamma": gamma}
    p_min = float(table.get("spec_draft_p_min", 0.0))
    if p_min > 0:
        chain.update(confidence_stop=True, confidence_threshold=p_min)
        fid.add(APPROXIMATED, STOP_RULE)
    if kind == "eagle3":
        fid.add(APPROXIMATED, "llama.cpp's eagle3 type is read from arg.cpp only; its drafting is not checked against specframe's")
        drafter = Ref("eagle3", {"path": path})
    else:
        drafter = Ref("model", {"model": path})
    return drafter, Ref("chain", chain), Ref("greedy", {}), fid
