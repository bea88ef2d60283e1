"""The sampling verifier inside a batch of 4: each row's first two tokens follow the target's
(warped) distribution, as single-sequence decoding's do (tests/test_sampling_distribution.py)."""

from __future__ import annotations

import pytest
import torch
from test_sampling_distribution import (  # the single-sequence suite's cases and exact tables
    ALPHA, E2E_SAMPLES, PROMPT, V, WARPS, _check, _models, _model_row, _seed, exact_two_tokens,
)

import specframe
from specframe.decode.batch import BatchDecoder

ROWS = 4
CASES = [(("talon", {"budget": 10}), "T1.0")]


@pytest.mark.parametrize("arm, warp_name", CASES, ids=[f"{a[0]}-{w}" for a, w in CASES])
def test_batched_rows_follow_the_target_distribution(arm, warp_name, verifier=None):
    target, draft = _models()
    dec = specframe.SpecDecoder.build(target=target, drafter=("model", {"model": draft}), policy=arm,
                                      verifier=verifier or ("sampling", WARPS[warp_name]))
    batch = BatchDecoder(dec)
    base = _seed("batch", arm[0], warp_name)
    counts = torch.zeros(V, V, dtype=torch.long)
    accepted = 0
    for k in range(E2E_SAMPLES // ROWS):
        out = batch.generate([list(PROMPT)] * ROWS, max_new_tokens=2, eos_token_id=None,
                             seeds=[base + ROWS * k + b for b in range(ROWS)])
        for row in out.outputs:
            counts[row.tokens[0], row.tokens[1]] += 1
            accepted += row.steps[0].accepted
    p_value = _check(counts, exact_two_tokens(_model_row, WARPS[warp_name]), f"engine batch {arm[0]} {warp_name}")
    assert accepted > E2E_SAMPLES // 10, "drafts are almost never accepted: the case would not test acceptance"
    assert p_value >= ALPHA, f"batched {arm[0]} at {warp_name}: chi-square p = {p_value:.3g} < {ALPHA}"
