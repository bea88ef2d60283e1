"""specframe: a research framework for tree-based speculative decoding.

Draft trees are built by a TreePolicy driving a Drafter and checked by a Verifier in one target
forward with tree attention. Policies, drafters and verifiers are pluggy plugins.

The public names below load on first access (PEP 562), so ``import specframe`` -- and the
pytest plugin ``specframe.testing.pytest_plugin``, which every pytest run of an environment with
specframe installed imports -- stays cheap and never imports torch by itself.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

#: public name -> submodule defining it
_EXPORTS = {
    "EngineError": "decode.engine", "GenerationOutput": "decode.engine", "SpecDecoder": "decode.engine",
    "StepView": "decode.engine", "BatchDecoder": "decode.batch", "BatchOutput": "decode.batch",
    "generate_batch": "decode.batch", "BatchAllocator": "decode.allocate",
    "DraftSession": "interfaces", "Drafter": "interfaces", "StepStats": "interfaces",
    "TreePolicy": "interfaces", "Verifier": "interfaces",
    "BudgetOptions": "options", "OptionError": "options",
    "PluginError": "plugins", "available": "plugins", "get_registry": "plugins", "hookimpl": "plugins",
    "register_plugin": "plugins",
    "TargetModel": "models.target", "UnsupportedModelError": "models.target", "load_causal_lm": "models.target",
    "load_tokenizer": "models.tokenizer",
    "DraftTree": "tree", "InvalidTreeError": "tree", "SideRows": "interfaces", "SideOutput": "interfaces",
    "top_indices": "selection", "topk_per_row": "selection",
    # the policy author's toolkit (docs/auto-sizing.md, docs/tutorial-policy.md)
    "AutoBudgetOptions": "sizing", "AutoSizedPolicy": "sizing", "AutoSizer": "sizing", "Growth": "sizing",
    "MuBandit": "sizing",
    "append_children": "building", "build_from_rank_paths": "building", "child_scores": "building",
    "select_top": "building",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    """Import the submodule defining ``name`` on first access (also ``specframe.<submodule>``)."""
    if name in _EXPORTS:
        value = getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
        globals()[name] = value
        return value
    try:
        return importlib.import_module(f".{name}", __name__)
    except ModuleNotFoundError as err:
        if err.name != f"{__name__}.{name}":
            raise
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
