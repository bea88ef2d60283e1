"""A load-aware arm's batch allocator in vLLM's and SGLang's vocabulary (docs/load.md).

vLLM: ``num_speculative_tokens_per_batch_size`` (``SpeculativeConfig`` in
``vllm/config/speculative.py`` @ :data:`VLLM_COMMIT`; its rules in
``vllm/v1/spec_decode/dynamic/utils.py`` @ :data:`VLLM_SCHEDULE_COMMIT`: inclusive
``(start, end, K)`` ranges from batch size 1, a gap or the tail keeping the K before it, K
clamped to ``num_speculative_tokens``). That commit has no ``disable_by_batch_size`` field: the
V0 engine had it (``vllm/spec_decode/spec_decode_worker.py`` @ :data:`VLLM_V0_COMMIT`: all
speculation off when ``running_queue_size >= disable_by_batch_size``), so ``threshold`` exports
as the equivalent schedule.

SGLang: upstream ``ServerArgs`` (``python/sglang/srt/server_args.py`` @ :data:`SGLANG_UPSTREAM`)
has no batch-size fallback; PR #13376 (``--speculative-batch-size-threshold``) closed without
being merged. The fallback ships in the TLT fork's SGLang (mit-han-lab/fastrl
``third-party/sglang`` @ :data:`SGLANG_FORK_COMMIT`) as :data:`SGLANG_THRESHOLD` (the source's
spelling): speculation off while the running batch is larger than the threshold
(``managers/scheduler.py``), back on only after 10 decode batches in a row at or below it
(``speculative/eagle_worker.py``, ``adaptive_spec_warmup_checks``). vLLM's rule is ``>=``, so
``disable_by_batch_size = T`` exports as threshold ``T - 1``.
"""

from __future__ import annotations

from typing import Any

from specframe.serving.engines.common import option_values
from specframe.serving.engines.fidelity import APPROXIMATED, NOT_EXPRESSIBLE, Export

VLLM_COMMIT = "002e77c1f0ef9b19cff8b9e21cfbd6feb3d6b443"
VLLM_SCHEDULE_COMMIT = "14b450ca590cbff96e7004bdb147a5d3acf5a4f6"
VLLM_V0_COMMIT = "a4aeba173c6b5f488684d738c41ca7ea4e66d4cf"
#: SGLang's server_args.py as read upstream: no batch-size fallback there.
SGLANG_UPSTREAM = "001067fffe33427bee0ed2f007fb7551a1d76b44"
#: The TLT fork whose vendored SGLang has the fallback, and its field (spelled as in its source).
SGLANG_FORK_COMMIT = "bce3df7a4d46473912e9b81bf47bca419729557f"
SGLANG_THRESHOLD = "apdative_speculative_batch_size_threshold"
#: Allocators whose rule depends on the live batch (the others split a budget and do not export).
LOAD_AWARE = ("threshold", "schedule", "goodput")


def add_allocator(out: Export, arm: Any) -> Export:
    """``out`` (the arm's export) with its load-aware allocator added, and the fidelity it keeps."""
    alloc = arm.batch_allocator
    if alloc is None or alloc.name not in LOAD_AWARE:
        return out
    options = option_values("allocators", alloc)  # the allocator's own defaults, never a copy here
    if out.engine == "vllm":
        _vllm(out, alloc.name, options)
    elif out.engine == "sglang":
        _sglang(out, alloc.name, options)
    else:
        out.fidelity.add(NOT_EXPRESSIBLE, f"{out.engine} serves no batch of requests: the {alloc.name!r} allocator "
                                          "has nothing to decide there")
    return out


def _threshold(options: dict) -> int:
    return int(options["disable_by_batch_size"])


def _vllm(out: Export, name: str, options: dict) -> None:
    depth = out.settings.get("num_speculative_tokens")
    if name == "goodput":
        out.fidelity.add(NOT_EXPRESSIBLE, f"vLLM @ {VLLM_COMMIT[:12]} has no per-request goodput rule; export a "
                                          "schedule of the draft lengths goodput chose at each batch size instead")
        return
    if depth is None:
        out.fidelity.add(NOT_EXPRESSIBLE, f"the {name!r} allocator needs num_speculative_tokens, which this arm "
                                          "does not export")
        return
    if name == "threshold":
        limit = _threshold(options)
        schedule = [[1, limit - 1, depth], [limit, limit, 0]] if limit > 1 else [[1, 1, 0]]
        out.needs.append(f"vLLM releases with the V0 engine: disable_by_batch_size = {limit} instead of the schedule "
                         f"(vllm/spec_decode/spec_decode_worker.py @ {VLLM_V0_COMMIT[:12]})")
    else:
        schedule = [[lo, hi, min(tokens, depth)] for lo, hi, tokens in options["schedule"]]
        out.fidelity.add(APPROXIMATED, "a schedule's tokens are a node budget of tokens + 1 for the arm's own tree; "
                                       "vLLM drafts a chain of that many tokens")
    out.settings["num_speculative_tokens_per_batch_size"] = schedule
    out.fidelity.add(APPROXIMATED, "vLLM counts the scheduled batch (running requests); specframe the live "
                                   "sequences of a step: the same number when every request decodes")


def _sglang(out: Export, name: str, options: dict) -> None:
    if name != "threshold":
        out.fidelity.add(NOT_EXPRESSIBLE, f"SGLang falls back to plain decoding above one batch size only; "
                                          f"the {name!r} allocator's rule has no SGLang argument")
        return
    out.settings[SGLANG_THRESHOLD] = _threshold(options) - 1  # SGLang: off above it; vLLM and specframe: at it
    out.needs.append(f"the TLT fork's SGLang (mit-han-lab/fastrl third-party/sglang @ {SGLANG_FORK_COMMIT[:12]}): "
                     f"upstream SGLang @ {SGLANG_UPSTREAM[:12]} has no batch-size fallback (PR #13376 was not merged)")
    out.fidelity.add(APPROXIMATED, "SGLang turns speculation back on only after 10 decode batches in a row at or "
                                   "below the threshold, and re-prefills every request then; specframe switches "
                                   "back at the next step")
