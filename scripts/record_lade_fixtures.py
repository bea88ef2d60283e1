"""Record Lookahead decoding's steps from its authors' package, ``lade`` 0.0.2, for
tests/test_parity_lookahead.py (tests/fixtures/lade_steps.json).

lade patches transformers 4.36/4.37's ``greedy_search``, so this runs in a venv of its own, not
specframe's (it imports no specframe)::

    python -m venv /work/venv-lade
    /work/venv-lade/bin/pip install torch==2.13.0 transformers==4.37.2
    /work/venv-lade/bin/pip install --no-deps lade==0.0.2
    /work/venv-lade/bin/python scripts/record_lade_fixtures.py tests/fixtures/lade_steps.json

A tiny float64 Llama whose weights :func:`tiny_weights` draws from a seed (so specframe's test
builds the same model under its own transformers) decodes each case's prompt with
``USE_LADE=1``. Each step's state is read from lade's own loop (its locals, as each forward
starts): the guesses it verifies (``token_map[lst_token]``), the tokens it emitted and a digest of
its whole pool (``token_map``); the last step's pool is kept in full.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys

import torch

CONFIG = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=512, rms_norm_eps=1e-6)
SEED = 7
#: (N, W, G, prompt, max_new_tokens): Spec-Bench's defaults and smaller windows.
CASES = [
    (5, 7, 7, [3, 17, 9, 3, 17, 9, 3, 17], 48),
    (4, 5, 3, [11, 2, 11, 2, 11, 2, 40, 41], 48),
    (3, 4, 2, [5, 9, 2, 5, 9], 40),
]


def tiny_weights(model: torch.nn.Module, seed: int) -> None:
    """Every parameter drawn from ``seed`` in name order (norms near 1, the rest N(0, 0.5)):
    the same weights under any transformers version with Llama's parameter names."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in sorted(model.named_parameters()):
            noise = torch.randn(param.shape, generator=gen, dtype=torch.float64)
            param.copy_(1.0 + 0.1 * noise if name.endswith("norm.weight") else 0.5 * noise)


def pool_digest(pool: dict) -> str:
    """A digest of a pool: its keys in order, each key's grams in LRU order."""
    text = json.dumps(sorted((int(k), [list(map(int, g)) for g in v]) for k, v in pool.items()))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def record_case(level: int, window: int, guess_set: int, prompt: list[int], max_new: int) -> dict:
    import lade
    from transformers import LlamaConfig, LlamaForCausalLM

    # lade builds its masks with torch.full(..., finfo(model dtype).min) in the default dtype:
    # a float64 model needs float64 defaults (float32 cannot hold float64's min).
    torch.set_default_dtype(torch.float64)
    lade.augment_all()
    lade.config_lade(LEVEL=level, WINDOW_SIZE=window, GUESS_SET_SIZE=guess_set, ALWAYS_FWD_ONE=1, DEBUG=0)
    config = LlamaConfig(**CONFIG)
    config._attn_implementation = "eager"
    model = LlamaForCausalLM(config).double().eval()
    tiny_weights(model, SEED)
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = None
    steps: list[dict] = []
    forward = model.jforward_multilevel

    def spy(*args, **kwargs):
        state = sys._getframe(1).f_locals  # lade's loop, as this step's forward starts
        if steps:  # the previous step's outcome, now that the loop moved on
            steps[-1]["emitted"] = len(state["all_old_tokens"]) - steps[-1]["_before"]
            steps[-1]["pool"] = pool_digest(state["token_map"])
        guesses = kwargs.get("guess_tokens")
        size = level - 1
        steps.append({"guesses": [guesses[i : i + size] for i in range(0, len(guesses), size)] if guesses else [],
                      "_before": len(state["all_old_tokens"])})
        out = forward(*args, **kwargs)
        spy.last = state
        return out

    model.jforward_multilevel = spy
    os.environ["USE_LADE"] = "1"
    ids = torch.tensor([prompt])
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new, do_sample=False)
    state = spy.last
    steps[-1]["emitted"] = len(state["all_old_tokens"]) - steps[-1]["_before"]
    steps[-1]["pool"] = pool_digest(state["token_map"])
    for step in steps:
        del step["_before"]
    return {"level": level, "window": window, "guess_set": guess_set, "prompt": prompt, "max_new_tokens": max_new,
            "tokens": out[0, len(prompt):].tolist(), "steps": steps,
            "final_pool": sorted([int(k), [list(map(int, g)) for g in v]] for k, v in state["token_map"].items()),
            "weights_sum": float(sum(p.double().sum() for p in model.parameters()))}


def main(path: str) -> None:
    import lade
    import transformers

    cases = [record_case(*case) for case in CASES]
    meta = {"lade": "0.0.2", "transformers": transformers.__version__, "torch": torch.__version__,
            "config": CONFIG, "seed": SEED, "script": "scripts/record_lade_fixtures.py",
            "licence": "steps recorded from lade 0.0.2 (Apache-2.0, hao-ai-lab/LookaheadDecoding)"}
    del lade
    with open(path, "w", encoding="utf-8") as fh:
        json.dump({"meta": meta, "cases": cases}, fh, separators=(",", ":"))
        fh.write("\n")
    for case in cases:
        hits = sum(1 for s in case["steps"] if s["emitted"] > 1)
        print(f"N={case['level']} W={case['window']} G={case['guess_set']}: {len(case['steps'])} steps, "
              f"{len(case['tokens'])} tokens, {hits} steps accepted guesses")
    print(f"wrote {path}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "tests/fixtures/lade_steps.json")
