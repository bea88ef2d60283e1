"""Tiny random targets and drafters for the conformance suite and for plugin authors' own tests.

Importing this module is cheap (torch and transformers load inside the functions), because the
pytest plugin ``specframe.testing.pytest_plugin`` re-exports its fixtures at pytest start-up.

* :func:`tiny_target` / :func:`close_draft`: a cached float64 Llama (vocab 64, hidden 32,
  2 layers) and a perturbed copy of it that agrees with it often.
* :func:`default_drafter`: builds a drafter under test from its plugin spec; the built-in
  drafters that need construction arguments (``model``, ``eagle``, ``eagle3``) get tiny ones.
* :data:`BUILTIN_SETTINGS`: the conformance class attributes of specframe's own plugins.
* pytest fixtures ``specframe_tiny_target``, ``specframe_target_model``, ``specframe_close_draft``
  and ``specframe_synthetic_drafter``.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any, Callable

import pytest

#: Vocabulary of the tiny models (small, so draft trees overlap the target's argmax often).
VOCAB = 64
#: Seed of the tiny target used by the suite.
TARGET_SEED = 3

#: The tiny pair as experiment-file tables: a random float64 Llama target on the CPU, a perturbed
#: copy of it as the draft model, and the model drafter over it. Test files that write an
#: experiment put their own top-level keys before it and their arms and ``[data]`` after it.
TINY_PAIR_TOML = """
[target]
model = "random:llama"
dtype = "float64"
device = "cpu"
random = { vocab_size = 64, hidden = 32, layers = 2, seed = 0 }

[models.draft]
model = "perturbed:target"
random = { noise = 0.05, seed = 1 }

[drafter]
name = "model"
options = { model = "draft" }
"""


def tiny_experiment_toml(name: str, max_new_tokens: int, ngram_arm: bool = True, output: str | None = None) -> str:
    """An experiment file over the tiny pair that replays: autoregressive, ``talon`` (N = 6)
    and, with ``ngram_arm``, ``ngram+chain`` (gamma 3), on ``prompts.jsonl`` beside it."""
    ngram = '\n[[arm]]\npolicy = "chain"\ndrafter = "ngram"\npolicy_options = { gamma = 3 }\n' if ngram_arm else ""
    out = f'\n[output]\ndir = "{output}"\n' if output else ""
    return (f'name = "{name}"\nmax_new_tokens = {max_new_tokens}\nwarmup = 0\nstop_at_eos = false\nthreads = 1\n'
            + TINY_PAIR_TOML
            + '\n[[arm]]\nbaseline = "autoregressive"\n\n[[arm]]\npolicy = "talon"\n'
              'policy_options = { budget = 6, mu = 0.03 }\n'
            + ngram + '\n[data]\npath = "prompts.jsonl"\n' + out)


@lru_cache(maxsize=None)
def tiny_target(seed: int = TARGET_SEED, vocab_size: int = VOCAB, layers: int = 2, arch: str = "llama") -> Any:
    """A cached tiny random transformers causal LM in float64 (exact greedy equality holds)."""
    import torch

    from specframe.testing.models import tiny_model

    return tiny_model(arch, seed=seed, vocab_size=vocab_size, hidden=32, layers=layers, dtype=torch.float64)


@lru_cache(maxsize=None)
def _perturbed(model_id: int, noise: float, seed: int) -> Any:
    from specframe.testing.models import perturbed_copy

    return perturbed_copy(_MODELS[model_id], noise, seed=seed)


_MODELS: dict[int, Any] = {}


def close_draft(target: Any, noise: float = 0.05, seed: int = 1) -> Any:
    """A cached perturbed copy of the transformers model ``target``: a draft that agrees often."""
    _MODELS[id(target)] = target  # keep it alive so its id stays unique while cached
    return _perturbed(id(target), float(noise), int(seed))


# ---------------------------------------------------------------------- built-in drafters
def _model_drafter(target: Any) -> Any:
    from specframe.decode.engine import make_plugin

    return make_plugin("drafters", ("model", {"model": close_draft(target.model)}), target)


@lru_cache(maxsize=None)
def _eagle_head(model_id: int, kind: str) -> Any:
    from specframe.drafters.eagle_checkpoint import random_head

    # EAGLE-3 with a reduced draft vocabulary: rows are -inf outside it (policies must cope).
    extra = {"draft_vocab_size": 40} if kind == "eagle3" else {}
    return random_head(_MODELS[model_id], kind, seed=1, **extra)


def _eagle_drafter(kind: str) -> Callable[[Any], Any]:
    def build(target: Any) -> Any:
        from specframe.decode.engine import make_plugin

        _MODELS[id(target.model)] = target.model
        return make_plugin("drafters", (kind, {"head": _eagle_head(id(target.model), kind)}), target)

    return build


def _medusa_drafter(target: Any) -> Any:
    """Medusa heads of fixed random weights (seed 0) sized for ``target``."""
    from specframe.decode.engine import make_plugin
    from specframe.drafters.medusa import random_heads

    hidden = int(target.model.config.get_text_config().hidden_size)
    return make_plugin("drafters", ("medusa", {"heads": random_heads(hidden, int(target.vocab_size))}), target)


def _hydra_drafter(target: Any) -> Any:
    """Grounded Hydra heads of fixed random weights (seed 0): four heads of two blocks."""
    from specframe.decode.engine import make_plugin
    from specframe.drafters.hydra_heads import random_heads

    config = target.model.config.get_text_config()
    heads = random_heads(int(config.hidden_size), int(target.vocab_size), 4, 2, base_config=config)
    return make_plugin("drafters", ("hydra", {"heads": heads}), target)


#: Factories of built-in drafters that cannot be built from default options, keyed by the
#: registered class's ``module:qualname`` (only the built-in class itself gets them).
BUILTIN_DRAFTER_FACTORIES: dict[str, Callable[[Any], Any]] = {
    "specframe.drafters.model:ModelDrafter": _model_drafter,
    "specframe.drafters.eagle:EagleDrafter": _eagle_drafter("eagle"),
    "specframe.drafters.eagle3:Eagle3Drafter": _eagle_drafter("eagle3"),
    "specframe.drafters.medusa:MedusaDrafter": _medusa_drafter,
    "specframe.drafters.hydra:HydraDrafter": _hydra_drafter,
}

#: Conformance class attributes of specframe's own plugins, by (kind, name): the built-in
#: policies that pick children by rank must record every node's true rank.
#: Why ``suffix`` at its defaults leaves rows empty (docs/parity.md).
SUFFIX_EMPTY_ROWS = ("as SuffixDecoding's reference, it drafts nothing where no context matches: such a row "
                     "is empty (fallback_prob > 0 gives it one fallback token)")

#: Why ``lookahead`` leaves rows empty (docs/drafters.md).
LOOKAHEAD_EMPTY_ROWS = ("as lade, it drafts only the pool's continuations of the root: a row no guess "
                        "continues is empty, and so is every row until the Jacobi window has filled")

BUILTIN_SETTINGS: dict[tuple[str, str], dict[str, Any]] = {
    ("policies", name): {"strict_ranks": True}
    for name in ("chain", "talon", "eagle", "static", "opt-tree", "sequoia")
} | {
    # Greedy decoding is the sampling verifier with only the argmax left after warping.
    ("verifiers", "sampling"): {"greedy_plugin": ("sampling", {"top_k": 1})},
    # Traversal Verification verifies sampled trees only: its end-to-end runs draft them.
    ("verifiers", "traversal"): {"greedy_plugin": ("traversal", {"top_k": 1}),
                                 "engine_policy": ("sampled-tree", {"k": 2, "depth": 3})},
    ("drafters", "suffix"): {"expected_failures": {"test_expand_rows_are_log_distributions": SUFFIX_EMPTY_ROWS}},
    ("drafters", "lookahead"): {"expected_failures": {"test_expand_rows_are_log_distributions": LOOKAHEAD_EMPTY_ROWS},
                                "policies": ("chain", "talon", ("talon", {"budget": 30}))},
}


#: The acceptance vector the engine tests give ``sequoia`` (a decaying profile, as a
#: well-matched pair measures): written out, so the recorded steps do not move with a default.
SEQUOIA_TEST_ACCEPTANCE = (0.55, 0.15, 0.07, 0.04, 0.03, 0.02, 0.015, 0.01)


def is_builtin(kind: str, name: str) -> bool:
    """Whether ``name`` of ``kind`` is one of specframe's own plugins (the ``specframe``
    distribution's), not a third party's installed beside them."""
    from specframe.plugins import get_registry

    return name in get_registry().names(kind, dist="specframe")


def fixed_policy_spec(name: str) -> Any:
    """A built-in policy at a fixed size, as the engine tests decode it: budget 6 (the fixed-shape
    ``chain`` and ``static`` at their defaults, ``sequoia`` at its defaults with
    :data:`SEQUOIA_TEST_ACCEPTANCE`), ``sampled-tree`` seeded so that a solo and a batched row
    draw alike. A third party's policy gets the options its own declared defaults give: these
    settings are the built-ins', and another policy need not take a ``budget`` at all."""
    if name in ("chain", "static") or not is_builtin("policies", name):
        return name
    if name == "sequoia":
        return (name, {"acceptance": list(SEQUOIA_TEST_ACCEPTANCE)})
    return (name, {"budget": 6, "seed": 0}) if name == "sampled-tree" else (name, {"budget": 6})


def class_key(cls: type) -> str:
    """``module:qualname`` of a plugin class (how the tables above name classes)."""
    return f"{cls.__module__}:{cls.__qualname__}"


def default_drafter(spec: Any, target: Any) -> Any:
    """The drafter under test for ``spec`` (name or ``(name, options)``) on ``target`` (TargetModel).

    A built-in drafter that needs construction arguments gets tiny ones when ``spec`` is a bare
    name; anything else is built from its options like the engine does.
    """
    from specframe.decode.engine import make_plugin
    from specframe.plugins import get_registry

    if isinstance(spec, str):
        factory = BUILTIN_DRAFTER_FACTORIES.get(class_key(get_registry().get("drafters", spec)))
        if factory is not None:
            return factory(target)
    return make_plugin("drafters", spec, target)


# ---------------------------------------------------------------------- pytest fixtures
@pytest.fixture(scope="session")
def specframe_tiny_target() -> Any:
    """A tiny random float64 Llama (transformers model; vocab 64, hidden 32, 2 layers)."""
    return tiny_target()


@pytest.fixture
def specframe_target_model(specframe_tiny_target: Any) -> Any:
    """A fresh :class:`~specframe.models.target.TargetModel` over the tiny target (own KV cache)."""
    from specframe.models.target import TargetModel

    return TargetModel(specframe_tiny_target)


@pytest.fixture(scope="session")
def specframe_close_draft(specframe_tiny_target: Any) -> Any:
    """A perturbed copy of the tiny target: pass it as the ``model`` drafter's ``model``."""
    return close_draft(specframe_tiny_target)


@pytest.fixture
def specframe_synthetic_drafter() -> Any:
    """A model-free :class:`~specframe.testing.synthetic.SyntheticDrafter` (V = 64, seed 0)."""
    from specframe.testing.synthetic import SyntheticDrafter

    return SyntheticDrafter(VOCAB, temperature=0.5, seed=0)


def char_tokenizer() -> Any:
    """A one-character-per-token fast tokenizer (ids 0 = EOS, 1 = unknown; 50 ids) that the
    trainers' tests save beside a tiny target, so that no tokenizer is downloaded."""
    import string

    from tokenizers import Regex, Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<eos>": 0, "<unk>": 1}
    for ch in string.ascii_lowercase + string.digits + " \n.,:()=_+-*":
        vocab[ch] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>", unk_token="<unk>", pad_token="<eos>")
