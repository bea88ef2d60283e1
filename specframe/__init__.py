"""specframe: a research framework for tree-based speculative decoding.

Draft trees are built by a TreePolicy driving a Drafter and checked by a Verifier in one target
forward with tree attention. Policies, drafters and verifiers are pluggy plugins.
"""

from .engine import EngineError, GenerationOutput, SpecDecoder
from .interfaces import DraftSession, Drafter, StepStats, TreePolicy, Verdict, Verifier
from .options import OptionError
from .plugins import PluginError, available, get_registry, hookimpl, register_plugin
from .target import TargetModel, UnsupportedModelError, load_causal_lm
from .tree import DraftTree, InvalidTreeError

__version__ = "0.1.0"

__all__ = [
    "DraftSession", "DraftTree", "Drafter", "EngineError", "GenerationOutput", "InvalidTreeError",
    "OptionError", "PluginError", "SpecDecoder", "StepStats", "TargetModel", "TreePolicy",
    "UnsupportedModelError", "Verdict", "Verifier", "available", "get_registry", "hookimpl",
    "load_causal_lm", "register_plugin",
]
