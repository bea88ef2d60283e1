"""Parity of the ``lookahead`` drafter with Lookahead decoding's package, ``lade`` 0.0.2 (what
Spec-Bench runs): lade's own code is the oracle.

Function level, lade's modules loaded from the installed sdist by file path (their transformers
imports stubbed: lade needs transformers 4.34, specframe a newer one):

- ``j_make_causal_mask_multilevel`` equals the mask specframe's forward gives the root, the
  guesses and the window's side rows (:class:`specframe.decode.side_rows.Block`), reordered to
  lade's row order, over a grid of (N, W, G) and every fill level;
- the state block of lade's decoding loop (prefill, fill, ``update_token_map``'s pool update and
  the ``ALWAYS_FWD_ONE`` shift), executed as lade's source has it, moves the window and the pool
  exactly as :class:`JacobiWindow` and :class:`NgramPool` do, on random token streams.

Step level: tests/fixtures/lade_steps.json, recorded from lade itself decoding a tiny float64
Llama (scripts/record_lade_fixtures.py, in a venv with transformers 4.34.1): the same model in
specframe (``drop_bonus = true``, a tree policy that keeps every guess) verifies the same guesses,
accepts as many tokens and holds the same pool after every step.

Skipped, naming the package, where lade is not installed (``scripts/install_parity.sh``); a
failure instead under ``SPECFRAME_REQUIRE_PARITY=1``, as CI runs it. The step-level test needs
only the fixture and runs everywhere.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import json
import os
import random
import sys
import types
from pathlib import Path

import pytest
import torch

import specframe
from specframe.decode.side_rows import Block
from specframe.drafters.lookahead_pool import JacobiWindow, NgramPool, jacobi_mask, window_offsets
from specframe.interfaces import SideRows
from specframe.testing import parity
from specframe.tree import DraftTree

FIXTURE = Path(__file__).parent / "fixtures" / "lade_steps.json"
GRID = [(n, w, g) for n in (3, 4, 5, 7) for w in (1, 3, 7) for g in (1, 3, 7)]


def _lade_dir() -> Path:
    spec = importlib.util.find_spec("lade")  # finds the package without importing it
    if spec is None or not spec.submodule_search_locations:
        if os.environ.get(parity.REQUIRE_ENV, "") not in ("", "0"):
            pytest.fail(f"lade 0.0.2 is not installed: {parity.INSTALL}")
        pytest.skip(f"lade (Lookahead decoding's reference) is not installed: {parity.INSTALL}")
    return Path(spec.submodule_search_locations[0])


@pytest.fixture(scope="module")
def lade_mask():
    """lade's ``j_make_causal_mask_multilevel``, its module loaded with a stand-in for the
    transformers names it imports (never called by that function)."""
    stub = types.ModuleType("transformers.models.llama.modeling_llama")
    stub.BaseModelOutputWithPast = stub.CausalLMOutputWithPast = stub._expand_mask = None
    name = "transformers.models.llama.modeling_llama"
    saved = sys.modules.get(name)
    sys.modules[name] = stub
    try:
        spec = importlib.util.spec_from_file_location("lade_reference_llama", _lade_dir() / "models" / "llama.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        if saved is None:
            del sys.modules[name]
        else:
            sys.modules[name] = saved
    return module.j_make_causal_mask_multilevel


@pytest.fixture(scope="module")
def lade_state_block():
    """The state block of lade's ``jacobi_greedy_search_multilevel`` (``if past_tokens[1] is
    None: ... else: ...``: prefill, fill, verification, pool update and window shift), compiled
    from lade's source as it stands."""
    source = (_lade_dir() / "decoding.py").read_text(encoding="utf-8")
    loop = next(n for n in ast.parse(source).body
                if isinstance(n, ast.FunctionDef) and n.name == "jacobi_greedy_search_multilevel")
    block = next(n for n in ast.walk(loop) if isinstance(n, ast.If) and ast.unparse(n.test) == "past_tokens[1] is None")
    return compile(ast.Module(body=[block], type_ignores=[]), "lade/decoding.py", "exec")


def _levels_of(window: JacobiWindow) -> list[int]:
    return [len(lv) for lv in window.rows()]


def _chains(root: int, guesses: list[list[int]]) -> DraftTree:
    """lade's guesses as a tree of separate chains below the root (lade's row order)."""
    tree = DraftTree.root(root)
    for guess in guesses:
        parent = 0
        for token in guess:
            tree = tree.add_nodes(torch.tensor([parent]), torch.tensor([token]), torch.zeros(1))
            parent = len(tree) - 1
    return tree


@pytest.mark.parametrize("level,width,guess_set", GRID)
def test_the_forward_mask_is_lades(lade_mask, level, width, guess_set):
    rng = random.Random(level * 100 + width * 10 + guess_set)
    window = JacobiWindow([rng.randrange(50) for _ in range(9)], level, width, seed=10)
    while True:
        sizes = _levels_of(window)
        guesses = [[rng.randrange(50) for _ in range(level - 1)] for _ in range(rng.randint(0, guess_set))] \
            if window.full else []
        flat_guess = [t for g in guesses for t in g] or None
        total = 1 + sum(sizes) + len(flat_guess or [])
        want = lade_mask(sizes, window.prefill, width, flat_guess, level - 1, False, False, (1, total),
                         torch.float32, torch.device("cpu"), 0)[0, 0] == 0
        tokens = [t for lv in window.rows() for t in lv]
        side = SideRows(tokens, window_offsets(sizes), jacobi_mask(sizes, window.prefill)[1:, 1:])
        block = Block(_chains(3, guesses), side, committed=10)
        n = block.size  # specframe's order: root, guesses, window; lade's: root, window, guesses
        order = [0] + list(range(n, len(block))) + list(range(1, n))
        got = block.ancestor_mask()[order][:, order]
        assert torch.equal(got, want), (level, width, sizes, window.prefill)
        if window.full:
            break
        window.advance([rng.randrange(50) for _ in range(sizes[-1])])


def _lade_state(level, width, guess_set, prompt):
    random.seed(10)  # lade's seeded draw of level 0 from the prompt
    first = [random.choice(prompt) for _ in range(width + level - 3)]
    return {"past_tokens": [first] + [None] * (level - 2), "fill_level": 0, "token_map": {}, "LEVEL": level,
            "WINDOW_SIZE": width, "GUESS_SET_SIZE": guess_set, "GUESS_SIZE": level - 1, "ALWAYS_FWD_ONE": 1,
            "torch": torch}


class _Outputs:
    """A forward's outputs as lade's loop reads them: logits whose argmax is ``new``."""

    def __init__(self, new: list[int]) -> None:
        self.inp_logits = torch.nn.functional.one_hot(torch.tensor([new]), 64).float()


@pytest.mark.parametrize("level,width,guess_set", GRID)
def test_the_window_and_pool_move_as_lades_loop_moves_them(lade_state_block, level, width, guess_set):
    rng = random.Random(level * 7 + width * 3 + guess_set)
    vocab = rng.choice([3, 8, 50])  # small vocabularies repeat keys and n-grams: the LRU is exercised
    prompt = [rng.randrange(vocab) for _ in range(rng.randint(1, 12))]
    state = _lade_state(level, width, guess_set, prompt)
    window, pool = JacobiWindow(prompt, level, width, seed=10), NgramPool(level, guess_set)
    assert window.levels[0] == state["past_tokens"][0]
    for _ in range(40):
        root = rng.randrange(vocab)
        new = [rng.randrange(vocab) for _ in range(_levels_of(window)[-1])]
        state.update(outputs=_Outputs(new), guess_tokens=None, lst_token=root, max_hit=0, first_guess=0,
                     hits=[0] * (level - 1))
        exec(lade_state_block, state)
        if window.full:
            pool.update(root, window.levels, new)
        window.advance(new)
        assert window.levels == state["past_tokens"]
        assert window.fill == state["fill_level"]
        assert pool.map == state["token_map"]


# ---------------------------------------------------------------------- step by step
def _tiny(config: dict, seed: int):
    """The recording's model (scripts/record_lade_fixtures.py tiny_weights), in float64."""
    from transformers import LlamaConfig, LlamaForCausalLM

    model = LlamaForCausalLM(LlamaConfig(**config, attn_implementation="sdpa")).double().eval()
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in sorted(model.named_parameters()):
            noise = torch.randn(param.shape, generator=gen, dtype=torch.float64)
            param.copy_(1.0 + 0.1 * noise if name.endswith("norm.weight") else 0.5 * noise)
    return model


def _digest(pool: dict) -> str:
    text = json.dumps(sorted((int(k), [list(map(int, g)) for g in v]) for k, v in pool.items()))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


RECORDED = json.loads(FIXTURE.read_text(encoding="utf-8"))


@pytest.mark.parametrize("case", RECORDED["cases"], ids=lambda c: f"N{c['level']}-W{c['window']}-G{c['guess_set']}")
def test_each_step_is_lades(case):
    model = _tiny(RECORDED["meta"]["config"], RECORDED["meta"]["seed"])
    assert float(sum(p.detach().sum() for p in model.parameters())) == pytest.approx(case["weights_sum"], abs=1e-9)
    options = {"level": case["level"], "window": case["window"], "guess_set": case["guess_set"], "drop_bonus": True}
    budget = case["guess_set"] * (case["level"] - 1) + 1  # every guess fits: lade verifies them all
    dec = specframe.SpecDecoder.build(model, drafter=("lookahead", options), policy=("talon", {"budget": budget}))
    drafter, guesses, steps = dec.drafter, [], []
    side_rows = drafter.side_rows

    def spy(context_len, max_position):  # after the build, before the pool learns the step
        guesses.append([list(g) for g in drafter.pool.guesses(drafter.root)] if drafter.window.full else [])
        return side_rows(context_len, max_position)

    drafter.side_rows = spy
    out = dec.generate(case["prompt"], max_new_tokens=case["max_new_tokens"], eos_token_id=None,
                       on_step=lambda view: steps.append((view.stats.emitted, _digest(drafter.pool.map))))
    assert out.tokens == case["tokens"]
    want = case["steps"]
    assert len(steps) == len(want)
    assert sum(1 for s in want if s["emitted"] > 1) > 0, "the recording never accepts a guess: it would test nothing"
    for i, (step, guessed, (emitted, digest)) in enumerate(zip(want, guesses, steps)):
        assert guessed == step["guesses"], f"step {i}: guesses"
        if i < len(want) - 1:  # the last step's output is cut at max_new_tokens (lade cuts after it)
            assert emitted == step["emitted"], f"step {i}: accepted"
        assert digest == step["pool"], f"step {i}: pool"
    assert sorted([k, v] for k, v in ((int(k), [list(g) for g in v]) for k, v in drafter.pool.map.items())) \
        == case["final_pool"]
