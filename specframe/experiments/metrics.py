"""The paper's metrics, computed from answer records only (so reports can be regenerated).

Definitions (pinned in docs/experiments.md):
- tau = tokens emitted / target forwards, bonus token included;
- delta = draft forwards / target forwards;
- tokens/s = tokens / wall time;
- speedup = wall time of the autoregressive arm / wall time of the arm, summed over the same
  (question, repeat) pairs; mean and standard deviation over repeats, and a bootstrap CI over
  questions;
- target forwards per token = target forwards / tokens (= 1 / tau);
- acceptance funnel: for every (depth, sibling rank), the fraction of verification steps whose
  accepted path holds a node of that depth and rank;
- mismatches: for greedy arms, answers whose tokens differ from the autoregressive arm's;
- TTFT: mean time to first token over the turns that recorded it (seconds);
- prefill share: sum of prefill seconds / sum of wall seconds, over the turns that recorded a
  prefill (records written before these keys, and arms that cannot time a prefill apart, have
  none: the metric is None, not 0);
- accuracy: share of answers whose last turn's text holds the question's reference answer
  (:mod:`specframe.experiments.accuracy`), over answers whose question has one; references come from
  run.json's ``"references"`` (question id as JSON -> answer), absent when there are none.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from pathlib import Path
from typing import Iterable

import numpy as np

from specframe.experiments.accuracy import score
from specframe.experiments.pairing import check_devices, pair_key, per_device
from specframe.experiments.runs import RunDir, answer_key as _key, read_answers

#: A top-2 logit margin below this is a float32 near-tie: the same sums in another order (another
#: batch shape, tree or kernel) can flip the argmax there; a divergence at a larger margin is a bug.
NEAR_TIE = 1e-3

ALL = "all"
MAX_RANK = 10  # funnel columns 0..MAX_RANK-1 and one bucket for ranks >= MAX_RANK
BOOTSTRAP = 2000


def answer_key(record: dict) -> tuple[str, int]:
    """``(question_id as JSON, repeat)``: what pairs answers of two arms."""
    return _key(record["question_id"], record.get("repeat", 0))


def tokens_of(record: dict) -> int:
    """New tokens over all turns."""
    return int(sum(record["choices"][0]["new_tokens"]))


def wall_of(record: dict) -> float:
    """Wall seconds over all turns."""
    return float(sum(record["choices"][0]["wall_time"]))


def target_forwards_of(record: dict) -> int:
    """Target forwards over all turns (Spec-Bench's decoding_steps)."""
    return int(sum(record["choices"][0]["decoding_steps"]))


def draft_forwards_of(record: dict) -> int:
    """Draft forwards over all turns (0 when not recorded)."""
    return int(sum(record.get("draft_forwards", [0])))


# ---------------------------------------------------------------------- totals
def totals(records: list[dict]) -> dict:
    """tau, delta, tokens/s and target forwards per token over ``records``."""
    tokens = sum(tokens_of(r) for r in records)
    target = sum(target_forwards_of(r) for r in records)
    draft = sum(draft_forwards_of(r) for r in records)
    wall = sum(wall_of(r) for r in records)
    return {
        "answers": len(records), "tokens": tokens, "target_forwards": target, "draft_forwards": draft,
        "wall_time": wall,
        "tau": tokens / target if target else None,
        "delta": draft / target if target else None,
        "tokens_per_s": tokens / wall if wall > 0 else None,
        "target_forwards_per_token": target / tokens if tokens else None,
        **first_token(records),
    }


def first_token(records: list[dict]) -> dict:
    """``{"ttft": mean seconds to the first token, "prefill_share": prefill / wall}`` over the
    turns that recorded them; None where no turn did."""
    ttfts = [float(v) for r in records for v in (r.get("time_to_first_token") or []) if v is not None]
    pairs = [(float(p), float(w)) for r in records
             for p, w in zip(r.get("prefill_time") or [], r["choices"][0]["wall_time"]) if p is not None]
    wall = sum(w for _, w in pairs)
    return {"ttft": sum(ttfts) / len(ttfts) if ttfts else None,
            "prefill_share": sum(p for p, _ in pairs) / wall if pairs and wall > 0 else None}


def bootstrap_ratio_ci(num: np.ndarray, den: np.ndarray, level: float = 0.95, seed: int = 0) -> list[float] | None:
    """CI of ``sum(num) / sum(den)`` resampling paired items with replacement."""
    if len(num) < 2:
        return None
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(num), size=(BOOTSTRAP, len(num)))
    ratios = num[idx].sum(axis=1) / den[idx].sum(axis=1)
    tail = (1 - level) / 2 * 100
    return [float(np.percentile(ratios, tail)), float(np.percentile(ratios, 100 - tail))]


def speedup(records: list[dict], base: list[dict]) -> dict:
    """Paired speedup of ``records`` over ``base`` (autoregressive) on their common answers,
    each pair on one device (:func:`~specframe.experiments.pairing.pair_key`)."""
    mine = {pair_key(r): r for r in records}
    ref = {pair_key(r): r for r in base}
    common = sorted(set(mine) & set(ref))
    if not common:
        return {"speedup": None, "speedup_std": None, "speedup_repeats": [], "speedup_ci": None, "paired": 0}
    per_repeat: dict[int, list[float]] = defaultdict(lambda: [0.0, 0.0])
    per_question: dict[tuple, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for key in common:
        a, b = wall_of(ref[key]), wall_of(mine[key])
        for acc in (per_repeat[key[1]], per_question[key[0]]):
            acc[0] += a
            acc[1] += b
    ratios = [a / b for a, b in per_repeat.values() if b > 0]
    q = np.array(list(per_question.values()))
    return {
        "speedup": float(np.mean(ratios)) if ratios else None,
        "speedup_std": float(np.std(ratios, ddof=1)) if len(ratios) > 1 else None,
        "speedup_repeats": ratios,
        "speedup_ci": bootstrap_ratio_ci(q[:, 0], q[:, 1]) if (q[:, 1] > 0).all() else None,
        "paired": len(common),
    }


def paired_outputs(records: list[dict], base: list[dict]) -> list[tuple[list, list]]:
    """``(output_ids, the baseline's output_ids)`` of every answer both have."""
    ref = {answer_key(r): r["output_ids"] for r in base if "output_ids" in r}
    return [(r["output_ids"], ref[answer_key(r)]) for r in records if "output_ids" in r and answer_key(r) in ref]


def mismatches(records: list[dict], base: list[dict]) -> dict:
    """How many answers' tokens differ from the baseline's (common answers only)."""
    pairs = paired_outputs(records, base)
    return {"mismatches": sum(a != b for a, b in pairs), "compared": len(pairs)}


def identical(records: list[dict], base: list[dict]) -> dict:
    """For an arm allowed to differ (a lossy verifier): the share of answers identical to the
    baseline's, and the mean token position where the others first leave it."""
    pairs = paired_outputs(records, base)
    firsts = [_first_divergence(a, b) for a, b in pairs if a != b]
    return {"identical": (len(pairs) - len(firsts)) / len(pairs) if pairs else None, "compared": len(pairs),
            "first_divergence": float(np.mean(firsts)) if firsts else None}


def _first_divergence(a: list[list[int]], b: list[list[int]]) -> int:
    """Tokens of ``a`` (turns concatenated) before its first difference from ``b``."""
    flat_a, flat_b = [t for turn in a for t in turn], [t for turn in b for t in turn]
    return common_prefix(flat_a, flat_b)


def nll(records: list[dict]) -> dict | None:
    """``{"nll": mean per token, "nll_tokens"}`` over scored answers (``nll`` per turn, summed
    nats); None when no answer is scored."""
    scored = [r for r in records if r.get("nll") is not None]
    if not scored:
        return None
    tokens = sum(tokens_of(r) for r in scored)
    return {"nll": sum(sum(r["nll"]) for r in scored) / max(1, tokens), "nll_tokens": tokens}


# ---------------------------------------------------------------------- tree statistics
def funnel(records: list[dict], max_rank: int = MAX_RANK) -> dict | None:
    """Acceptance funnel: ``frequency[d-1][r]`` = share of steps accepting a depth-d node of rank r.

    Ranks >= ``max_rank`` share the last column; nodes of unknown rank (-1) are counted apart.
    """
    paths = [ranks for r in records for ranks in r.get("steps", {}).get("accepted_ranks", [])]
    if not paths:
        return None
    depth = max((len(p) for p in paths), default=0)
    counts = np.zeros((max(depth, 1), max_rank + 1), dtype=np.int64)
    unknown = 0
    for ranks in paths:
        for d, rank in enumerate(ranks):
            if rank < 0:
                unknown += 1
            else:
                counts[d, min(rank, max_rank)] += 1
    return {"steps": len(paths), "counts": counts.tolist(),
            "frequency": (counts / len(paths)).tolist(), "unknown_rank": unknown, "max_rank": max_rank}


def tree_shapes(records: list[dict]) -> dict | None:
    """Distributions of tree depth and width: histograms and the mean width at each depth."""
    steps = [r["steps"] for r in records if r.get("steps")]
    depths = [d for s in steps for d in s.get("depth", [])]
    widths = [w for s in steps for w in s.get("widths", [])]
    if not depths:
        return None
    deepest = max(len(w) for w in widths) if widths else 1
    padded = np.zeros((len(widths), deepest))
    for i, w in enumerate(widths):
        padded[i, : len(w)] = w
    max_width = [max(w[1:], default=0) for w in widths]
    sizes = [n for s in steps for n in s.get("tree_size", [])]
    return {
        "depth_hist": np.bincount(depths).tolist(),
        "max_width_hist": np.bincount(max_width).tolist() if max_width else [],
        "width_profile": padded.mean(axis=0).tolist(),
        "mean_depth": float(np.mean(depths)),
        "mean_tree_size": float(np.mean(sizes)) if sizes else None,
        "steps": len(depths),
    }


def step_points(records: list[dict]) -> list[tuple[float, float]]:
    """Per-answer ``(delta, tau)`` points for the delta-vs-tau scatter."""
    out = []
    for r in records:
        target = target_forwards_of(r)
        if target:
            out.append((draft_forwards_of(r) / target, tokens_of(r) / target))
    return out


# ---------------------------------------------------------------------- summary
def by_category(records: list[dict]) -> dict[str, list[dict]]:
    """``{"all": records, category: records...}``, categories sorted."""
    groups: dict[str, list[dict]] = defaultdict(list)
    for r in records:
        groups[str(r.get("category", ALL))].append(r)
    return {ALL: list(records), **{k: groups[k] for k in sorted(groups)}}


def last_turn_text(record: dict) -> str:
    """The decoded text of an answer's last turn ("" when it has none)."""
    turns = record["choices"][0].get("turns") or [""]
    return str(turns[-1])


def accuracy(records: list[dict], references: dict[str, object] | None) -> dict | None:
    """``{"accuracy", "correct", "scored"}`` of ``records`` against ``references``.

    ``references``: question id (as JSON) -> reference answer. Only answers whose question has
    a reference are scored; None when none has (so "no reference" never reads as 0%).
    """
    if not references:
        return None
    pairs = [(last_turn_text(r), references.get(json.dumps(r["question_id"]))) for r in records]
    return score(pairs)


def arm_metrics(records: list[dict], base: list[dict] | None, greedy: bool,
                references: dict[str, object] | None = None, lossy: bool = False) -> dict:
    """Every table metric of one arm over ``records`` (one category or all); a ``lossy`` arm
    gets its identical share instead of a mismatch count."""
    out = totals(records)
    if base is not None:
        out.update(speedup(records, base))
        if greedy:
            out.update(identical(records, base) if lossy else mismatches(records, base))
    out.update(nll(records) or {})
    acc = accuracy(records, references)
    if acc is not None:
        out.update(acc)
    return out


def summarize(run: dict, allow_mixed_devices: bool = False) -> dict:
    """The whole summary of a run: ``run`` from :func:`load_run`. Devices of unlike kinds are
    refused unless ``allow_mixed_devices`` (:func:`~specframe.experiments.pairing.check_devices`)."""
    arms = run["arms"]
    on_devices = check_devices(run, allow_mixed_devices)
    base_name = run.get("baseline")
    base = arms.get(base_name) if base_name else None
    references = run.get("references") or {}
    lossy = run.get("lossy") or {}
    out_arms = []
    for name, records in arms.items():
        greedy = bool(run["greedy"].get(name, False))
        base_groups = by_category(base) if base is not None else {}
        cats = {cat: arm_metrics(recs, base_groups.get(cat, []) if base is not None else None, greedy, references,
                                 name in lossy)
                for cat, recs in by_category(records).items()}
        out_arms.append({
            "name": name, "greedy": greedy, "description": run["descriptions"].get(name, {}),
            **({"lossy": lossy[name]} if name in lossy else {}),
            "overall": cats[ALL], "categories": {k: v for k, v in cats.items() if k != ALL},
            "funnel": funnel(records), "shapes": tree_shapes(records),
            "budget_cuts": budget_cuts(records),
            **({"devices": per_device(records, base, speedup)}
               if base is not None and len(on_devices["devices"]) > 1 else {}),
        })
    reference = nll_reference(out_arms)
    if reference is not None:
        add_nll_gaps(out_arms, next(a for a in out_arms if a["name"] == reference))
        for arm in out_arms:
            if arm["name"] != reference and arm["overall"].get("nll_gap") is not None:
                arm["overall"]["nll_gap_ci"] = nll_gap_ci(arms[arm["name"]], arms[reference])
    return {"name": run.get("name"), "target": run.get("target"), "max_new_tokens": run.get("max_new_tokens"),
            "repeats": run.get("repeats"), "baseline": base_name, "torch": run.get("torch"), "arms": out_arms,
            "overflow_skipped": run.get("overflow_skipped", []),
            **({"nll_reference": reference} if reference else {}),
            **{k: v for k, v in on_devices.items() if v}}  # a run without devices summarizes as before


def add_nll_gaps(arms: list[dict], reference: dict) -> None:
    """``nll_gap``: each scored arm's NLL per token less the reference arm's, overall and per category."""
    for arm in arms:
        pairs = [(arm["overall"], reference["overall"])]
        pairs += [(m, reference["categories"].get(k)) for k, m in arm["categories"].items()]
        for mine, theirs in pairs:
            if theirs and mine.get("nll") is not None and theirs.get("nll") is not None:
                mine["nll_gap"] = mine["nll"] - theirs["nll"]


def nll_gap_ci(records: list[dict], reference: list[dict], level: float = 0.95, seed: int = 0) -> list[float] | None:
    """Bootstrap CI (questions resampled, paired) of the NLL-per-token gap of ``records`` to
    ``reference``: how much of a gap the sampling of a few dozen answers explains."""
    ref = {answer_key(r): r for r in reference if r.get("nll") is not None}
    pairs = [(r, ref[answer_key(r)]) for r in records if r.get("nll") is not None and answer_key(r) in ref]
    if len(pairs) < 2:
        return None
    cols = np.array([[sum(a["nll"]), tokens_of(a), sum(b["nll"]), tokens_of(b)] for a, b in pairs], dtype=float)
    idx = np.random.default_rng(seed).integers(0, len(pairs), size=(BOOTSTRAP, len(pairs)))
    sums = cols[idx].sum(axis=1)
    gaps = sums[:, 0] / np.maximum(sums[:, 1], 1) - sums[:, 2] / np.maximum(sums[:, 3], 1)
    tail = (1 - level) / 2 * 100
    return [float(np.percentile(gaps, tail)), float(np.percentile(gaps, 100 - tail))]


def nll_reference(arms: list[dict]) -> str | None:
    """The arm whose negative log-likelihood the others' gap is taken against: the first
    scored lossless arm (a lossy arm's text is measured against what exact decoding writes)."""
    return next((a["name"] for a in arms if "lossy" not in a and a["overall"].get("nll") is not None), None)


def budget_cuts(records: Iterable[dict]) -> dict:
    """Steps whose node budget the context reduced: ``{"steps", "of", "max_cut"}``."""
    cuts = [c for r in records for c in (r.get("steps") or {}).get("budget_cut", [])]
    return {"steps": sum(1 for c in cuts if c > 0), "of": len(cuts), "max_cut": max(cuts, default=0)}


def load_run(out_dir: str | Path) -> dict:
    """Records of every arm of a run directory, in the config's arm order, plus its metadata.

    run.json's keys come along as they are, among them ``"references"`` (question id as JSON ->
    reference answer) when the questions carry answers.
    """
    run_dir = RunDir(out_dir)
    meta = json.loads(run_dir.run_file.read_text(encoding="utf-8"))
    arms = {}
    for name in meta["arms"]:
        # A file holds one arm's answers; a record of another arm (a name that slugs the same) is not this one's.
        records = [r for r in read_answers(run_dir.answers(name)) if r.get("arm", name) == name]
        if records:
            arms[name] = records
    base = next((n for n in arms if meta["arms"][n].get("baseline") == "autoregressive"), None)
    greedy = dict(meta.get("greedy", {}))
    for name, records in arms.items():
        greedy.setdefault(name, all(r.get("greedy", False) for r in records))
    return {**meta, "arms": arms, "descriptions": meta["arms"], "baseline": base, "greedy": greedy}


# ---------------------------------------------------------------------- A/B comparison
def common_prefix(a: list[int], b: list[int]) -> int:
    """Length of the longest common prefix of two token lists."""
    n = min(len(a), len(b))
    diff = np.nonzero(np.asarray(a[:n]) != np.asarray(b[:n]))[0]
    return int(diff[0]) if len(diff) else n


def compare(records_a: Iterable[dict], records_b: Iterable[dict], level: float = 0.95, seed: int = 0) -> dict:
    """Paired comparison of arm B against arm A on their common (question, repeat) answers.

    ``ratio`` per answer = wall(A) / wall(B) (> 1: B is faster). Reports the geometric mean of
    the ratios with a bootstrap CI over answers, the ratio of total times, and token equality:
    identical outputs, and the share of tokens before the first divergence.
    """
    a = {answer_key(r): r for r in records_a}
    b = {answer_key(r): r for r in records_b}
    keys = sorted(set(a) & set(b))
    if not keys:
        raise ValueError("the two answer sets share no (question_id, repeat): nothing to compare")
    wa = np.array([wall_of(a[k]) for k in keys])
    wb = np.array([wall_of(b[k]) for k in keys])
    logs = np.log(wa / wb)
    ci = None
    if len(keys) >= 2:
        rng = np.random.default_rng(seed)
        idx = rng.integers(0, len(keys), size=(BOOTSTRAP, len(keys)))
        means = np.exp(logs[idx].mean(axis=1))
        tail = (1 - level) / 2 * 100
        ci = [float(np.percentile(means, tail)), float(np.percentile(means, 100 - tail))]
    equal, prefix, total = 0, 0, 0
    for k in keys:
        ta = [t for turn in a[k].get("output_ids", []) for t in turn]
        tb = [t for turn in b[k].get("output_ids", []) for t in turn]
        equal += ta == tb
        prefix += common_prefix(ta, tb)
        total += max(len(ta), len(tb))
    return {
        "pairs": len(keys),
        "speedup_geomean": float(math.exp(logs.mean())),
        "speedup_ci": ci,
        "ci_level": level,
        "speedup_total": float(wa.sum() / wb.sum()),
        "ratio_min": float(np.exp(logs.min())),
        "ratio_max": float(np.exp(logs.max())),
        "identical_outputs": int(equal),
        "token_agreement": prefix / total if total else 1.0,
        "tau_a": totals(list(a[k] for k in keys))["tau"],
        "tau_b": totals(list(b[k] for k in keys))["tau"],
    }
