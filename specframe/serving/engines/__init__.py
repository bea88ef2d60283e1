"""Arms in serving engines' vocabularies: export to vLLM, SGLang, transformers and llama.cpp,
and import their configurations as arms, each with a fidelity statement (docs/serving.md).

One module per engine (``vllm``, ``sglang``, ``hf``, ``llamacpp``), each recording the source
and version its names were read from; :mod:`.fidelity` holds the statement and the exported
form, :mod:`.common` what the mappings share.
"""

from __future__ import annotations

from types import ModuleType

from specframe.serving.engines.common import ExportContext
from specframe.serving.engines.fidelity import EngineError, Export, Fidelity, Ref

#: Engine name -> (module, the [[arm]] key holding its configuration).
ENGINES: dict[str, tuple[str, str]] = {
    "vllm": ("vllm", "speculative_config"),
    "sglang": ("sglang", "server_args"),
    "hf": ("hf", "generate_kwargs"),
    "llamacpp": ("llamacpp", "args"),
}


def engine_module(name: str) -> ModuleType:
    """The mapping module of engine ``name`` (refused by name, listing the engines)."""
    import importlib

    if name not in ENGINES:
        raise EngineError(f"unknown engine {name!r}; engines: {', '.join(ENGINES)}")
    return importlib.import_module(f"specframe.serving.engines.{ENGINES[name][0]}")


def export_arm(arm, engine: str, ctx: ExportContext | None = None) -> Export:
    """``arm`` (a specframe arm or a transformers baseline) in ``engine``'s vocabulary."""
    ctx = ctx or ExportContext()
    if arm.baseline is not None:
        return _export_baseline(arm, engine)
    from specframe.serving.engines.load_export import add_allocator

    return add_allocator(engine_module(engine).export(arm, ctx), arm)


def import_arm(engine: str, table: dict, where: str):
    """``(drafter, policy, verifier, fidelity)`` refs of an engine configuration table."""
    return engine_module(engine).import_arm(table, where)


def _export_baseline(arm, engine: str) -> Export:
    """A baseline arm: autoregressive is no speculation anywhere; transformers' own baselines
    are their ``generate`` arguments (exact in transformers, mapped like n-gram / model arms elsewhere)."""
    from specframe.serving.engines.common import ArmSpec
    from specframe.serving.engines.fidelity import EXACT, Ref

    o = arm.baseline_options
    if arm.baseline == "autoregressive":
        return Export(engine, {}, Fidelity(EXACT, []), ["no speculative settings: the engine's plain decoding"])
    if arm.baseline == "hf-prompt-lookup":
        settings = {"prompt_lookup_num_tokens": o.get("prompt_lookup_num_tokens", 10),
                    "max_matching_ngram_size": o.get("max_matching_ngram_size") or 2, "do_sample": False}
        if engine == "hf":
            return Export(engine, settings, Fidelity(), [], engine_module("hf").SOURCE)
        twin = ArmSpec(arm.name, drafter=Ref("ngram", {"max_ngram": settings["max_matching_ngram_size"]}),
                         policy=Ref("chain", {"gamma": settings["prompt_lookup_num_tokens"]}), verifier=Ref("greedy", {}))
    else:  # hf-assisted
        if engine == "hf":
            settings = {"assistant_model": o.get("assistant"), **{k: o.get(k) for k in engine_module("hf").ASSISTANT_KEYS
                                                                if o.get(k) is not None}, "do_sample": False}
            return Export(engine, settings, Fidelity(), [engine_module("hf").ASSISTANT_NOTE], engine_module("hf").SOURCE)
        # transformers' defaults where the baseline leaves them: 20 tokens, constant, a 0.4 stop.
        threshold = o.get("assistant_confidence_threshold")
        threshold = 0.4 if threshold is None else float(threshold)
        chain = {"gamma": o.get("num_assistant_tokens") or 20, "schedule": o.get("num_assistant_tokens_schedule") or "constant",
                 "confidence_stop": threshold > 0, "confidence_threshold": threshold}
        twin = ArmSpec(arm.name, drafter=Ref("model", {"model": o.get("assistant")}),
                         policy=Ref("chain", chain), verifier=Ref("greedy", {}))
    return engine_module(engine).export(twin, ExportContext())


__all__ = ["ENGINES", "EngineError", "Export", "ExportContext", "Fidelity", "Ref", "engine_module", "export_arm", "import_arm"]
