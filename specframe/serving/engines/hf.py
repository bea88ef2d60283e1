"""transformers: an arm as ``generate`` keyword arguments (JSON), and such arguments imported as an arm.

Names read from the installed transformers (:data:`SOURCE_VERSION`): ``GenerationConfig``'s
``prompt_lookup_num_tokens``, ``max_matching_ngram_size``, ``num_assistant_tokens``,
``num_assistant_tokens_schedule`` and ``assistant_confidence_threshold``, and ``generate``'s
``assistant_model``; the rules from ``generation/candidate_generator.py``:

- prompt lookup tries n-gram sizes from ``max_matching_ngram_size`` (default 2) down to 1 and
  copies ``prompt_lookup_num_tokens`` tokens after the first (leftmost) match;
- assisted generation drafts greedily from the assistant, ``num_assistant_tokens`` per step
  (``heuristic``: +2 after a fully accepted draft, else -1, at least 1), and stops a draft below
  ``assistant_confidence_threshold`` (0.4 by default; with scikit-learn installed transformers
  re-fits that threshold as it goes). It reads these three from the ASSISTANT's
  ``generation_config``.
"""

from __future__ import annotations

from typing import Any

from specframe.serving.engines.common import (
    ExportContext, chain_length, chain_of, model_path, note_unmapped, option_values, policy_depth,
    static_paths, verifier_fidelity, verifier_name,
)
from specframe.serving.engines.fidelity import (
    APPROXIMATED, EXACT, NOT_EXPRESSIBLE, EngineError, Export, Fidelity, Ref,
)

ENGINE = "hf"
#: The transformers version the names and rules were read from.
SOURCE_VERSION = "5.25.0"
SOURCE = f"transformers {SOURCE_VERSION} GenerationConfig and generation/candidate_generator.py (installed)"
#: Drafter options the mapping carries (others set away from their default are named).
MAPPED = {"ngram": {"max_ngram", "min_ngram"}, "model": {"model"}}
#: Keys an export writes and an import reads (``assistant_model`` is generate's own argument).
ASSISTANT_KEYS = ("num_assistant_tokens", "num_assistant_tokens_schedule", "assistant_confidence_threshold")
LOOKUP_KEYS = ("prompt_lookup_num_tokens", "max_matching_ngram_size")
IMPORTED = ("assistant_model", *ASSISTANT_KEYS, *LOOKUP_KEYS, "do_sample")
SCHEDULES = ("constant", "heuristic")
NGRAM_RULE = ("transformers' prompt lookup copies the tokens after the leftmost match of the longest n-gram "
              "(sizes max_matching_ngram_size down to 1); specframe's ngram takes the most frequent "
              "continuation, matching again at each drafted token")
ASSISTANT_NOTE = ("transformers reads num_assistant_tokens, num_assistant_tokens_schedule and "
                  "assistant_confidence_threshold from the assistant's generation_config: set them there "
                  "(passed to generate they set the target's, which assisted decoding does not read)")


def generation_fields() -> set[str]:
    """The attribute names of the installed ``GenerationConfig`` (what an export must stay within)."""
    from transformers import GenerationConfig

    return set(vars(GenerationConfig()))


def _chain(arm: Any, ctx: ExportContext, fid: Fidelity) -> tuple[int, dict]:
    """``(gamma, chain options)`` of the arm's policy; a tree is served as its top chain."""
    p = arm.policy
    if p.name == "chain":
        return chain_length(p, ctx, fid), option_values("policies", p)
    paths = static_paths(arm, ctx, fid)
    depth = chain_of(paths) if paths else policy_depth(p)
    fid.add(APPROXIMATED, f"transformers drafts chains: the {p.name} tree is served as a chain of {depth}")
    return depth, {}


def export(arm: Any, ctx: ExportContext) -> Export:
    """``arm`` as ``generate`` keyword arguments."""
    fid, settings, needs = Fidelity(), {}, []
    d = arm.drafter
    o = option_values("drafters", d)
    gamma, chain = _chain(arm, ctx, fid)
    if d.name == "ngram":
        settings.update(prompt_lookup_num_tokens=gamma, max_matching_ngram_size=int(o["max_ngram"]))
        fid.add(APPROXIMATED, NGRAM_RULE)
        if int(o["min_ngram"]) != 1:
            fid.add(APPROXIMATED, f"min_ngram {d.options['min_ngram']}: transformers matches down to 1 token")
    elif d.name == "model":
        schedule = chain.get("schedule", "constant")
        threshold = float(chain["confidence_threshold"]) if chain.get("confidence_stop") else 0.0
        settings.update(assistant_model=model_path(d.options.get("model"), ctx), num_assistant_tokens=gamma,
                        num_assistant_tokens_schedule=schedule, assistant_confidence_threshold=threshold)
        needs.append(ASSISTANT_NOTE)
        needs.append("the assistant as a transformers checkpoint sharing the target's tokenizer (load it and pass the model)")
        if schedule == "heuristic":
            fid.add(APPROXIMATED, f"transformers' heuristic schedule has no max_gamma cap ({chain.get('max_gamma', 32)} here)")
        if threshold:
            fid.add(APPROXIMATED, "with scikit-learn installed, transformers re-fits assistant_confidence_threshold as it decodes")
        if chain.get("sample"):
            fid.add(APPROXIMATED, "the chain samples its drafts; transformers' assistant drafts greedily")
    else:
        fid.add(NOT_EXPRESSIBLE, f"drafter {d.name!r}: transformers' generate drafts from an assistant model or by "
                "prompt lookup only")
    note_unmapped(arm, ENGINE, MAPPED.get(arm.drafter.name, set()), fid)
    fid.merge(verifier_fidelity(arm, ENGINE, "transformers verifies sampled candidates with its own random draws"))
    if verifier_name(arm) == "greedy":
        settings["do_sample"] = False
    else:
        settings["do_sample"] = True
    return Export(ENGINE, settings, fid, needs, SOURCE)


def import_arm(table: dict, where: str) -> tuple[Ref, Ref, Ref, Fidelity]:
    """``(drafter, policy, verifier, fidelity)`` of ``generate`` keyword arguments."""
    if not isinstance(table, dict):
        raise EngineError(f"{where}: generate_kwargs must be a table, got {table!r}")
    for key in table:
        if key not in IMPORTED:
            raise EngineError(f"{where}: generate_kwargs key {key!r} is not supported; supported: {', '.join(IMPORTED)}")
    if table.get("do_sample", False):
        raise EngineError(f"{where}: generate_kwargs do_sample = true: imported arms decode greedily; supported: false")
    fid = Fidelity()
    if "assistant_model" in table:
        if "prompt_lookup_num_tokens" in table:
            raise EngineError(f"{where}: generate_kwargs set both assistant_model and prompt_lookup_num_tokens; transformers takes one")
        model = table["assistant_model"]
        if not isinstance(model, str) or not model:
            raise EngineError(f"{where}: generate_kwargs.assistant_model must be a model path or name, got {model!r}")
        gamma = table.get("num_assistant_tokens", 20)
        schedule = table.get("num_assistant_tokens_schedule", "constant")
        if schedule not in SCHEDULES:
            raise EngineError(f"{where}: num_assistant_tokens_schedule {schedule!r} is not supported; supported: {', '.join(SCHEDULES)}")
        threshold = float(table.get("assistant_confidence_threshold", 0.4))
        chain: dict[str, Any] = {"gamma": int(gamma), "schedule": schedule}
        given = [k for k in ASSISTANT_KEYS if k in table]
        if given:  # exact where they are set as transformers reads them, which the statement says
            fid.add(EXACT, f"transformers {SOURCE_VERSION} reads {', '.join(given)} from the assistant's "
                    "generation_config, not from generate's arguments (passed there they set the target's, which "
                    "assisted decoding does not read): this arm runs them as set on the assistant's generation_config")
        if schedule == "heuristic":
            chain["max_gamma"] = max(32, int(gamma))
            fid.add(APPROXIMATED, f"transformers' heuristic schedule has no cap; specframe's stops at max_gamma {chain['max_gamma']}")
        if threshold > 0:
            chain.update(confidence_stop=True, confidence_threshold=threshold)
            fid.add(APPROXIMATED, "with scikit-learn installed, transformers re-fits assistant_confidence_threshold as it decodes")
        return Ref("model", {"model": model}), Ref("chain", chain), Ref("greedy", {}), fid
    if "prompt_lookup_num_tokens" in table:
        fid.add(APPROXIMATED, NGRAM_RULE)
        gamma = int(table["prompt_lookup_num_tokens"])
        size = int(table.get("max_matching_ngram_size") or 2)
        return (Ref("ngram", {"max_ngram": size, "min_ngram": 1}), Ref("chain", {"gamma": gamma}),
                Ref("greedy", {}), fid)
    raise EngineError(f"{where}: generate_kwargs need assistant_model or prompt_lookup_num_tokens (what transformers drafts with)")
