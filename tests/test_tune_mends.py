"""tune's mends (issue 61): a stratified split, log-int spaces refused at declaration, and the
public ``study.tell`` for trials a killed tune left running."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from specframe.experiments.data import Question
from specframe.search_space import SearchSpaceError, tunable
from specframe.tuning.evaluate import split_questions


def _questions(categories: str) -> list[Question]:
    return [Question(question_id=i, category=c, turns=[f"q{i}"]) for i, c in enumerate(categories)]


def test_a_file_sorted_by_category_searches_and_confirms_on_every_category():
    # MT-Bench's file is sorted by category: a prefix split searched only the first ones.
    searched, confirmation = split_questions(_questions("aaaabbbbcccc"), 0.5)
    assert {q.category for q in searched} == {q.category for q in confirmation} == {"a", "b", "c"}
    assert len(searched) == len(confirmation) == 6
    assert not {q.question_id for q in searched} & {q.question_id for q in confirmation}


def test_the_split_keeps_its_share_and_one_question_on_each_side():
    searched, confirmation = split_questions(_questions("abcde"), 0.5)
    assert len(searched) in (2, 3) and len(searched) + len(confirmation) == 5
    for split in (0.01, 0.99):
        searched, confirmation = split_questions(_questions("aab"), split)
        assert searched and confirmation


def test_an_int_log_range_with_a_step_is_refused_at_declaration_naming_the_option():
    with pytest.raises(SearchSpaceError, match=r"budget: int = tunable.*log scale takes step 1"):
        @dataclass
        class Bad:
            budget: int = tunable(8, low=2, high=64, log=True, step=2)


def test_recover_fails_the_dead_trials_through_the_public_api_and_enqueues_them_again():
    optuna = pytest.importorskip("optuna")
    from specframe.tuning.study import recover

    study = optuna.create_study(direction="maximize")
    dead = study.ask({"x": optuna.distributions.IntDistribution(1, 4)})  # left RUNNING, as by kill -9
    # The study alone suffices (no storage handle, no private trial id).
    assert recover(study) == 1
    states = [t.state.name for t in study.get_trials(deepcopy=False)]
    assert states == ["FAIL", "WAITING"]
    assert study.get_trials(deepcopy=False)[1].params == {} and \
        study.get_trials(deepcopy=False)[1].system_attrs["fixed_params"] == {"x": dead.params["x"]}


def test_a_study_recorded_before_the_stratified_split_resumes_on_the_questions_it_searched(tmp_path):
    import json

    from specframe.tuning.study import INPUTS, TuneSettings, recorded_split

    old = {"search": {"objective": "tau", "split": 0.5, "space": "all"}}  # inputs as recorded before
    (tmp_path / INPUTS).write_text(json.dumps(old))
    settings = recorded_split(tmp_path, TuneSettings(objective="tau"), fresh=False)
    assert settings.split_by == "prefix"
    assert settings.search() == old["search"]  # the recorded inputs still match: nothing refused
    qs = _questions("aaaabbbb")
    assert split_questions(qs, 0.5, settings.split_by)[0] == qs[: len(qs) // 2]
    # A new directory, or --fresh, takes the stratified split and records it.
    assert recorded_split(tmp_path, TuneSettings(), fresh=True).search()["split_by"] == "category"
    assert recorded_split(tmp_path / "new", TuneSettings(), fresh=False).split_by == "category"
