"""SGLang: an arm as server flags (``--speculative-*``), and server arguments imported as an arm.

Names read from sgl-project/sglang ``python/sglang/srt/server_args.py`` at commit
:data:`SOURCE_COMMIT` (``ServerArgs``' speculative-decoding fields; algorithms EAGLE, EAGLE3,
NEXTN, STANDALONE, NGRAM, DFLASH, DSPARK). At that commit the n-gram match window is no flag:
NGRAM drafts from a trie of earlier tokens walked breadth first
(``speculative_ngram_min/max_bfs_breadth``, ``speculative_ngram_max_trie_depth``).
A draft tree there is EAGLE-2's: ``speculative_eagle_topk`` children per node for
``speculative_num_steps`` levels, reranked to ``speculative_num_draft_tokens`` (root included).

Checked against the registry's sglang 0.5.23 (installed without dependencies on a CPU): its
``ServerArgs`` is constructed from every export (tests/test_engines.py, which skips where
sglang does not import).
"""

from __future__ import annotations

from typing import Any

from specframe.serving.engines.common import (
    ExportContext, chain_length, chain_of, model_path, note_unmapped, option_values, policy_depth,
    static_paths, verifier_fidelity, verifier_name,
)
from specframe.serving.engines.fidelity import APPROXIMATED, NOT_EXPRESSIBLE, EngineError, Export, Fidelity, Ref

ENGINE = "sglang"
SOURCE_COMMIT = "001067fffe33427bee0ed2f007fb7551a1d76b44"
SOURCE = f"sgl-project/sglang python/sglang/srt/server_args.py @ {SOURCE_COMMIT[:12]}"
#: Drafter options the mapping carries (others set away from their default are named).
MAPPED = {"model": {"model"}, "eagle": {"path", "head"}, "eagle3": {"path", "head"}}
ALGORITHMS = frozenset({"EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM", "DFLASH", "DSPARK"})
#: ServerArgs' speculative-decoding fields at SOURCE_COMMIT.
FIELDS = frozenset({
    "speculative_algorithm", "speculative_draft_model_path", "speculative_draft_model_revision",
    "speculative_draft_load_format", "speculative_num_steps", "speculative_eagle_topk",
    "speculative_num_draft_tokens", "speculative_dflash_block_size", "speculative_dspark_block_size",
    "speculative_accept_threshold_single", "speculative_accept_threshold_acc",
    "speculative_use_rejection_sampling", "speculative_token_map", "speculative_attention_mode",
    "speculative_draft_attention_backend", "speculative_dsa_topk_backend", "speculative_draft_kv_cache_dtype",
    "speculative_draft_window_size", "speculative_moe_runner_backend", "speculative_moe_a2a_backend",
    "speculative_draft_model_quantization", "speculative_skip_dp_mlp_sync", "enable_multi_layer_eagle",
    "speculative_adaptive", "speculative_adaptive_config", "speculative_ngram_min_bfs_breadth",
    "speculative_ngram_max_bfs_breadth", "speculative_ngram_match_type", "speculative_ngram_max_trie_depth",
    "speculative_ngram_capacity", "speculative_ngram_external_corpus_path", "speculative_ngram_external_sam_budget",
    "speculative_ngram_external_corpus_max_tokens",
})
#: The flag ServerArgs also accepts for the draft model path.
ALIASES = {"speculative_draft_model": "speculative_draft_model_path"}
IMPORTED = ("speculative_algorithm", "speculative_draft_model_path", "speculative_num_steps",
            "speculative_eagle_topk", "speculative_num_draft_tokens", "speculative_ngram_min_bfs_breadth",
            "speculative_ngram_max_bfs_breadth", "speculative_accept_threshold_single",
            "speculative_accept_threshold_acc")
ALGORITHM_OF = {"model": "STANDALONE", "eagle": "EAGLE", "eagle3": "EAGLE3", "ngram": "NGRAM"}
DRAFTER_OF = {"STANDALONE": "model", "EAGLE": "eagle", "EAGLE3": "eagle3", "NGRAM": "ngram"}
NGRAM_RULE = ("SGLang's NGRAM drafts from a trie of earlier tokens walked breadth first, not specframe's "
              "longest-suffix lookup, and its match window is no flag")
TREE_RULE = ("SGLang's tree is EAGLE-2's (top-k children per level, reranked to num_draft_tokens); "
             "its candidate set and tie-breaking are not checked against specframe's")


def _tree_settings(arm: Any, ctx: ExportContext, fid: Fidelity) -> tuple[int, int, int]:
    """``(num_steps, eagle_topk, num_draft_tokens)`` of the arm's policy."""
    p = arm.policy
    if p.name == "chain":
        gamma = chain_length(p, ctx, fid)
        if p.options.get("schedule", "constant") != "constant":
            fid.add(APPROXIMATED, f"chain schedule {p.options['schedule']!r} changes gamma each step; SGLang drafts a fixed count")
        if p.options.get("confidence_stop"):
            fid.add(APPROXIMATED, "the chain's confidence stop has no SGLang flag")
        return gamma, 1, gamma + 1
    if p.name == "eagle" and p.options.get("budget", 60) != "auto":
        fid.add(APPROXIMATED, TREE_RULE)
        o = option_values("policies", p)
        # specframe's depth counts the expansions after the root's (tree depth <= depth + 1);
        # SGLang's num_steps counts every drafted level.
        return int(o["depth"]) + 1, int(o["top_k"]), int(o["budget"])
    paths = static_paths(arm, ctx, fid)
    if paths is None:
        depth = policy_depth(p)
        o = option_values("policies", p)
        top_k = int(o.get("top_k", o.get("k", 4)))
        budget = o.get("budget", 16)
        budget = int(budget) if budget != "auto" else int(o.get("max_budget", 64))
        fid.add(APPROXIMATED, f"the {p.name} tree adapts each step and no acceptance is measured for it: served "
                f"as SGLang's top-{top_k} tree of {depth} levels and {budget} tokens")
        return depth, top_k, budget
    widest = max([sum(1 for q in paths if q[:-1] == p0) for p0 in [()] + list(paths)] or [1])
    fid.add(APPROXIMATED, f"SGLang builds no fixed rank-path tree: the {len(paths) + 1}-node tree is served as "
            f"top-{widest} over {chain_of(paths)} levels reranked to {len(paths) + 1} tokens; " + TREE_RULE)
    return chain_of(paths), widest, len(paths) + 1


def export(arm: Any, ctx: ExportContext) -> Export:
    """``arm`` as SGLang server arguments."""
    fid, settings, needs = Fidelity(), {}, []
    d = arm.drafter
    algorithm = ALGORITHM_OF.get(d.name)
    if algorithm is None:
        fid.add(NOT_EXPRESSIBLE, f"drafter {d.name!r} has no SGLang algorithm (algorithms at {SOURCE_COMMIT[:12]}: "
                f"{', '.join(sorted(ALGORITHMS))})")
        steps, topk, tokens = _tree_settings(arm, ctx, Fidelity())
    else:
        settings["speculative_algorithm"] = algorithm
        if d.name == "model":
            settings["speculative_draft_model_path"] = model_path(d.options.get("model"), ctx)
            needs.append("the draft model as a transformers checkpoint sharing the target's tokenizer")
        elif d.name in ("eagle", "eagle3"):
            settings["speculative_draft_model_path"] = model_path(d.options.get("path") or "", ctx)
            if d.options.get("path") is None:
                fid.add(NOT_EXPRESSIBLE, f"the {d.name} head is an in-memory object (option 'head'); SGLang loads a folder")
            needs.append(f"the {d.name.upper()} head folder in the official layout (SafeAILab/EAGLE's config.json + weights)")
        else:
            fid.add(APPROXIMATED, NGRAM_RULE)
        steps, topk, tokens = _tree_settings(arm, ctx, fid)
        if d.name == "ngram":
            settings.update(speculative_num_draft_tokens=tokens, speculative_ngram_min_bfs_breadth=1,
                            speculative_ngram_max_bfs_breadth=topk)
        else:
            settings.update(speculative_num_steps=steps, speculative_eagle_topk=topk,
                            speculative_num_draft_tokens=tokens)
    note_unmapped(arm, ENGINE, MAPPED.get(arm.drafter.name, set()), fid)
    fid.merge(verifier_fidelity(arm, ENGINE, "SGLang verifies sampled requests losslessly with its own random draws"))
    if verifier_name(arm) == "greedy":
        needs.append("greedy requests (temperature 0): the arm verifies greedily")
    return Export(ENGINE, settings, fid, needs, SOURCE)


def _int(table: dict, key: str) -> Any:
    value = table.get(key)
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise EngineError(f"{key} must be an integer >= 1, got {value!r}")
    return value


def normalise(table: dict) -> dict:
    """Keys as ServerArgs' field names: ``--speculative-num-steps`` -> ``speculative_num_steps``."""
    out = {}
    for key, value in table.items():
        name = str(key).lstrip("-").replace("-", "_")
        out[ALIASES.get(name, name)] = value
    return out


def import_arm(table: dict, where: str) -> tuple[Ref, Ref, Ref, Fidelity]:
    """``(drafter, policy, verifier, fidelity)`` of SGLang server arguments."""
    if not isinstance(table, dict):
        raise EngineError(f"{where}: server_args must be a table, got {table!r}")
    table = normalise(table)
    for key in table:
        if key not in IMPORTED:
            known = "an SGLang argument specframe does not model" if key in FIELDS else f"not an SGLang speculative argument at {SOURCE_COMMIT[:12]}"
            raise EngineError(f"{where}: server_args key {key!r} is {known}; supported: {', '.join(IMPORTED)}")
    algorithm = table.get("speculative_algorithm")
    if algorithm not in DRAFTER_OF:
        raise EngineError(f"{where}: speculative_algorithm {algorithm!r} is not supported; supported: {', '.join(DRAFTER_OF)}")
    for key in ("speculative_accept_threshold_single", "speculative_accept_threshold_acc"):
        if table.get(key, 1.0) != 1.0:
            raise EngineError(f"{where}: {key} = {table[key]} relaxes acceptance (lossy), which specframe has no verifier for; supported: 1.0")
    fid = Fidelity()
    steps, topk, tokens = (_int(table, k) for k in ("speculative_num_steps", "speculative_eagle_topk", "speculative_num_draft_tokens"))
    name = DRAFTER_OF[algorithm]
    if name == "ngram":
        fid.add(APPROXIMATED, NGRAM_RULE)
        drafter = Ref("ngram", {})
        breadth = _int(table, "speculative_ngram_max_bfs_breadth") or 10
        tokens = tokens or 8
        policy = (Ref("chain", {"gamma": tokens - 1}) if breadth == 1 else
                  Ref("eagle", {"top_k": breadth, "budget": tokens, "depth": tokens - 2,
                                      "max_budget": max(64, tokens)}))
        if tokens < 2:
            raise EngineError(f"{where}: speculative_num_draft_tokens must be >= 2 (the root and one drafted token), got {tokens}")
    else:
        path = table.get("speculative_draft_model_path")
        if not isinstance(path, str) or not path:
            raise EngineError(f"{where}: speculative_algorithm {algorithm} needs speculative_draft_model_path")
        drafter = Ref(name, {"model" if name == "model" else "path": path})
        if steps is None:
            raise EngineError(f"{where}: speculative_num_steps is required for {algorithm}")
        topk = topk or 1
        if topk == 1:
            if tokens not in (None, steps + 1):
                raise EngineError(f"{where}: with speculative_eagle_topk 1, speculative_num_draft_tokens must be "
                                  f"speculative_num_steps + 1 = {steps + 1}, got {tokens}")
            policy = Ref("chain", {"gamma": steps})
        else:
            fid.add(APPROXIMATED, TREE_RULE)
            budget = tokens or steps * topk + 1
            policy = Ref("eagle", {"top_k": topk, "depth": steps - 1, "budget": budget,
                                         "max_budget": max(64, budget)})
    return drafter, policy, Ref("greedy", {}), fid
