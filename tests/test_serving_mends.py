"""Serving's measurements share their machine description with the cost-curve cache keys."""

from __future__ import annotations

from specframe.models import cache_keys
from specframe.serving.acceptance import provenance


def test_provenance_names_the_cpu_the_cache_keys_name(monkeypatch):
    monkeypatch.setattr(cache_keys, "cpu_name", lambda: "Test CPU 9000")
    assert provenance("specframe acceptance")["machine"].startswith("Test CPU 9000, ")
    assert cache_keys.cpu_label() == "Test-CPU-9000"  # the key is the same name made safe


def test_an_imported_assistant_setting_says_transformers_reads_it_from_the_assistant():
    """transformers 5.25's AssistedCandidateGenerator reads num_assistant_tokens, its schedule and
    the confidence threshold from the assistant's generation_config; as generate kwargs they
    would not take effect, so an import that takes them says where they must be set."""
    from specframe.serving.engines import import_arm

    table = {"assistant_model": "draft/folder", "num_assistant_tokens": 5,
             "num_assistant_tokens_schedule": "constant", "assistant_confidence_threshold": 0.0}
    _drafter, policy, _verifier, fidelity = import_arm("hf", table, "[[arm]] #1")
    assert policy.options["gamma"] == 5
    assert "assistant's generation_config" in fidelity.statement


# ---------------------------------------------------------------------- acceptance at a leaf
def test_an_accepted_path_ending_at_a_leaf_tests_nothing_deeper():
    """Step 1: a tree 3 deep elsewhere, rank 0 accepted at depth 1 and that node has no children:
    depth 2 was never put to the test under the accepted path, so it is no miss there. Step 2:
    the same acceptance at a node with 2 children: depth 2 was tested and missed."""
    from specframe.serving.acceptance import count_steps

    steps, reached, hits = count_steps([{"depth": [3, 3], "accepted_ranks": [[0], [0]],
                                         "accepted_children": [0, 2]}])
    assert steps == 2
    assert reached == [2, 1] and hits == [[2], [0]]


def test_steps_recorded_without_the_leaf_column_count_as_before_and_say_so():
    """Answer records written before ``accepted_children`` was recorded count every stop short
    of the tree's depth as a miss (as they always did), and the acceptance says how many."""
    from specframe.serving.acceptance import basis, describe, from_records

    old = from_records([{"steps": {"depth": [3, 3], "accepted_ranks": [[0], [0]]}}], "arm", "run")
    assert old.reached == [2, 2] and old.unmarked_leaves == 2
    assert "2 of them were recorded without" in basis(old)
    assert "2 steps predate accepted_children" in describe(old)
    new = from_records([{"steps": {"depth": [3, 3], "accepted_ranks": [[0], [0]], "accepted_children": [0, 2]}}],
                       "arm", "run")
    assert new.reached == [2, 1] and new.unmarked_leaves == 0 and "recorded without" not in basis(new)
    assert "predate" not in describe(new)


def test_the_engine_records_the_children_of_the_last_accepted_node():
    """Each step's ``accepted_children`` is the number of children the tree gave the last node
    of the accepted path (the root when nothing was accepted), read in the step's one transfer."""
    import specframe
    from specframe.testing.fixtures import close_draft, tiny_target

    model = tiny_target()
    target = specframe.TargetModel(model)
    views = []
    dec = specframe.SpecDecoder.build(target=target, drafter=("model", {"model": close_draft(model)}),
                                      policy=("talon", {"budget": 8}))
    out = dec.generate([5, 9, 2], max_new_tokens=16, eos_token_id=None, on_step=views.append)
    seen = [(int((v.tree.parents == v.path[-1]).sum()), v.stats.accepted_children) for v in views]
    assert [want for want, _ in seen] == [got for _, got in seen]
    assert [s.accepted_children for s in out.steps] == [got for _, got in seen]
    assert any(want == 0 and len(v.tree) > 1 for (want, _), v in zip(seen, views)), "no step ended at a leaf"


def test_an_export_falling_back_to_recorded_steps_says_so():
    """Without an acceptance file, an export from a run fits the tree to the arm's recorded
    steps; the fidelity statement says it counted them, and that old steps lack the leaf column."""
    from specframe.experiments.config import ArmConfig, PluginRef
    from specframe.serving.engines import ExportContext, export_arm

    arm = ArmConfig("t", drafter=PluginRef("eagle3", {"path": "h"}), policy=PluginRef("talon", {"budget": 6}),
                    verifier=PluginRef("greedy"))
    steps = {"depth": [3] * 4, "accepted_ranks": [[0, 0], [1], [0, 1, 0], []]}
    old = export_arm(arm, "vllm", ExportContext(records=[{"steps": steps}])).fidelity.statement
    assert "no acceptance file was passed" in old and "4 recorded steps" in old
    assert "4 of them were recorded without" in old
    new = export_arm(arm, "vllm", ExportContext(
        records=[{"steps": {**steps, "accepted_children": [1, 0, 0, 2]}}])).fidelity.statement
    assert "no acceptance file was passed" in new and "recorded without" not in new


def test_the_recorded_premove_run_predates_the_leaf_column_and_is_counted_as_before():
    """tests/data/premove's talon answers were written before steps kept accepted_children:
    every one of their steps is counted the old way, and the acceptance says so."""
    import json
    from pathlib import Path

    from specframe.serving.acceptance import basis, from_records

    answers = Path(__file__).parent / "data" / "premove" / "run" / "answers" / "talon.jsonl"
    records = [json.loads(line) for line in answers.read_text(encoding="utf-8").splitlines() if line.strip()]
    assert not any("accepted_children" in r["steps"] for r in records)
    acc = from_records(records, "talon", str(answers))
    assert acc.steps == sum(len(r["steps"]["depth"]) for r in records) == acc.unmarked_leaves > 0
    assert f"{acc.steps} of them were recorded without accepted_children" in basis(acc)
