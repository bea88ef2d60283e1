"""The quality a lossy verifier costs: NLL under the target from the verification forwards, the
share of answers identical to autoregressive decoding, and how reports and plots show them."""

from __future__ import annotations

import json
import textwrap

import pytest
import torch

from specframe.decode.batch import BatchDecoder
from specframe.decode.engine import SpecDecoder, make_plugin
from specframe.experiments.experiment import run_experiment
from specframe.experiments.metrics import identical, load_run, nll, summarize
from specframe.experiments.plots import quality_pareto
from specframe.experiments.report import markdown, write_report
from specframe.experiments.runs import read_answers
from specframe.models.target import TargetModel
from specframe.testing.fixtures import TINY_PAIR_TOML, default_drafter, tiny_target
from specframe.testing.host_reads import HostReadCounter, _counted

PROMPTS = [[3, 17, 40, 2, 9], [5], [11, 3, 3, 8, 1, 40, 7]]


def recomputed_nll(prompt: list[int], output: list[int]) -> float:
    """The output's negative log-likelihood by one causal forward over prompt + output."""
    model = tiny_target()
    ids = torch.tensor([prompt + output])
    with torch.inference_mode():
        logp = torch.log_softmax(model(ids).logits[0].double(), dim=-1)
    rows = torch.arange(len(prompt) - 1, len(prompt) + len(output) - 1)
    return float(-logp[rows, torch.tensor(output)].sum())


def decoder(verifier: object = "greedy", drafter: str = "model", policy: object = ("talon", {"budget": 6})):
    target = TargetModel(tiny_target())
    return SpecDecoder(target, default_drafter(drafter, target), make_plugin("policies", policy),
                       make_plugin("verifiers", verifier))


@pytest.mark.parametrize("verifier", ["greedy", ("sampling", {"temperature": 0.8}),
                                      ("typical", {"epsilon": 0.3, "delta": 0.5, "temperature": 0.8}),
                                      ("margin", {"temperature": 0})])
@pytest.mark.parametrize("drafter", ["model", "ngram"])
def test_generate_scores_its_output_as_a_causal_forward_does(verifier, drafter):
    dec = decoder(verifier, drafter)
    for prompt in PROMPTS:
        out = dec.generate(prompt, max_new_tokens=12, eos_token_id=None, seed=3, score=True)
        assert out.nll == pytest.approx(recomputed_nll(prompt, out.tokens), rel=1e-9, abs=1e-9)
        assert dec.generate(prompt, max_new_tokens=12, eos_token_id=None, seed=3).nll is None


def test_a_cut_at_eos_scores_only_the_emitted_tokens():
    dec = decoder()
    first = dec.generate(PROMPTS[0], max_new_tokens=12, eos_token_id=None)
    eos = first.tokens[4]
    out = dec.generate(PROMPTS[0], max_new_tokens=12, eos_token_id=eos, score=True)
    assert out.tokens[-1] == eos and len(out.tokens) <= 5
    assert out.nll == pytest.approx(recomputed_nll(PROMPTS[0], out.tokens), rel=1e-9)


def test_every_row_of_a_batch_is_scored_as_it_is_alone():
    dec = decoder()
    batch = BatchDecoder(dec).generate(PROMPTS, max_new_tokens=10, eos_token_id=None, score=True)
    for prompt, out in zip(PROMPTS, batch.outputs):
        assert out.nll == pytest.approx(recomputed_nll(prompt, out.tokens), rel=1e-9)


def test_scoring_costs_one_host_read_per_generation():
    reads = {}
    for score in (False, True):
        dec = decoder(drafter="ngram")
        dec.strict = False
        counter = HostReadCounter()
        dec._step = _counted(dec._step, counter)
        out = dec.generate(PROMPTS[2], max_new_tokens=12, eos_token_id=None, score=score)
        reads[score] = (counter.total, len(out.steps))
    assert reads[True][0] == reads[False][0] + 1 and reads[True][1] == reads[False][1]


# ---------------------------------------------------------------------- metrics
def _record(qid: int, ids: list[int], nll_value: float | None = None) -> dict:
    record = {"question_id": qid, "repeat": 0, "output_ids": [ids],
              "choices": [{"new_tokens": [len(ids)], "wall_time": [1.0], "decoding_steps": [1]}]}
    if nll_value is not None:
        record["nll"] = [nll_value]
    return record


def test_identical_share_and_first_divergence():
    base = [_record(0, [1, 2, 3, 4]), _record(1, [5, 6, 7]), _record(2, [8, 9])]
    arm = [_record(0, [1, 2, 3, 4]), _record(1, [5, 0, 7]), _record(2, [8, 9, 1])]
    got = identical(arm, base)
    assert got["identical"] == pytest.approx(1 / 3) and got["compared"] == 3
    assert got["first_divergence"] == pytest.approx((1 + 2) / 2)  # [5|0] at 1, [8 9|1] at 2


def test_nll_gap_ci_covers_a_known_gap_and_is_none_for_one_answer():
    from specframe.experiments.metrics import nll_gap_ci

    arm = [_record(q, [1] * 10, 3.0 + 0.1 * (q % 3)) for q in range(30)]
    ref = [_record(q, [1] * 10, 2.0 + 0.1 * (q % 3)) for q in range(30)]
    low, high = nll_gap_ci(arm, ref)
    assert low == pytest.approx(0.1) and high == pytest.approx(0.1)  # every question: +1 nat / 10 tokens
    assert nll_gap_ci(arm[:1], ref[:1]) is None


def test_nll_is_per_token_over_scored_answers():
    assert nll([_record(0, [1, 2, 3, 4], 2.0), _record(1, [5, 6], 4.0)])["nll"] == pytest.approx(6.0 / 6)
    assert nll([_record(0, [1, 2])]) is None


# ---------------------------------------------------------------------- an experiment
CONFIG = """
name = "quality"
max_new_tokens = 8
warmup = 0
stop_at_eos = false
threads = 1
{pair}
[[arm]]
baseline = "autoregressive"

[[arm]]
name = "exact"
policy = "talon"
policy_options = {{ budget = 6 }}
verifier = "sampling"
verifier_options = {{ temperature = 0.8 }}

[[arm]]
name = "loose"
policy = "talon"
policy_options = {{ budget = 6 }}
verifier = "typical"
verifier_options = {{ epsilon = 0.5, delta = 0.9, temperature = 0.8 }}

[[arm]]
name = "loose-greedy"
policy = "talon"
policy_options = {{ budget = 6 }}
verifier = "margin"
verifier_options = {{ temperature = 0, ratio = 0.2 }}

[data]
path = "prompts.jsonl"

[output]
dir = "{out}"
"""


@pytest.fixture(scope="module")
def quality_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("quality")
    rows = [{"question_id": i, "category": "q", "turns": [f"q{i} " + "ab " * (i + 2)]} for i in range(4)]
    (tmp / "prompts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    path = tmp / "q.toml"
    path.write_text(textwrap.dedent(CONFIG.format(pair=TINY_PAIR_TOML, out=tmp / "run")))
    out = run_experiment(path, progress=False).out_dir
    write_report(out)
    return out


def test_a_run_with_a_lossy_arm_scores_every_speculative_arm(quality_run):
    for arm in ("exact", "loose", "loose-greedy"):
        records = read_answers(quality_run / "answers" / f"{arm}.jsonl")
        assert records and all(len(r["nll"]) == 1 and r["nll"][0] > 0 for r in records), arm
    assert "nll" not in read_answers(quality_run / "answers" / "autoregressive.jsonl")[0]
    meta = json.loads((quality_run / "run.json").read_text())
    assert meta["fingerprint"]["score"] is True
    assert set(meta["lossy"]) == {"loose", "loose-greedy"} and meta["lossy"]["loose"].startswith("typical ")


def test_the_report_marks_lossy_arms_with_their_quality(quality_run):
    summary = summarize(load_run(quality_run))
    arms = {a["name"]: a for a in summary["arms"]}
    assert summary["nll_reference"] == "exact"
    assert arms["exact"]["overall"]["nll_gap"] == 0.0
    assert "nll_gap" in arms["loose"]["overall"] and "mismatches" not in arms["loose-greedy"]["overall"]
    assert 0.0 <= arms["loose-greedy"]["overall"]["identical"] <= 1.0  # deterministic: compared with AR
    text = markdown(summary, {})
    assert "| NLL/token | NLL gap |" in text
    assert "lossy: typical delta=0.9 epsilon=0.5 temperature=0.8" in text
    assert "lossy: margin ratio=0.2 temperature=0; identical " in text
    assert (quality_run / "plots" / "quality_pareto.png").stat().st_size > 0
    low, high = arms["loose"]["overall"]["nll_gap_ci"]
    assert low <= arms["loose"]["overall"]["nll_gap"] <= high


def test_no_pareto_plot_without_a_lossy_arm(tmp_path):
    summary = {"arms": [{"name": "a", "overall": {"nll_gap": 0.0, "speedup": 1.2}, "categories": {}}]}
    assert quality_pareto(summary, tmp_path / "p.png") is None
