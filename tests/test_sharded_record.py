"""specframe record --ray: the trace recorded by a local Ray (2 workers x 1 thread) on the tiny
demo pair is the one-process trace entry for entry (hidden files byte for byte), each entry
naming the device that timed it; a second record keeps it; unlike device kinds are refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

pytest.importorskip("ray")

from ray_session import local_ray, lose_node  # noqa: E402,F401 - the session's Ray fixtures
from specframe.cli import cli  # noqa: E402
from tiny_demo import demo_config  # noqa: E402

#: What depends on the clock or the device, per entry and per trace.
TIMED = ("prefill_seconds", "device")


def _record(config: Path, out: Path, *extra: str):
    return CliRunner().invoke(cli, ["record", str(config), "--out", str(out), "--no-progress", *extra])


def _trace(out: Path) -> dict:
    return json.loads((out / "trace.json").read_text())


def test_a_sharded_trace_is_the_one_process_trace_and_is_kept_when_recorded(tmp_path, local_ray):
    config = demo_config(tmp_path)
    single = _record(config, tmp_path / "one")
    assert single.exit_code == 0, single.output
    sharded = _record(config, tmp_path / "sharded", "--ray", "--workers", "2")
    assert sharded.exit_code == 0, sharded.output
    one, many = _trace(tmp_path / "one"), _trace(tmp_path / "sharded")
    assert one["hidden_layers"] and one["hidden_layers"] == many["hidden_layers"]  # eagle3 reads hidden states
    assert one["settings"] == many["settings"]
    assert [p["key"] for p in one["prompts"]] == [p["key"] for p in many["prompts"]] and len(one["prompts"]) == 3
    for a, b in zip(one["prompts"], many["prompts"]):
        assert {k: v for k, v in a.items() if k not in TIMED} == {k: v for k, v in b.items() if k not in TIMED}
        assert (tmp_path / "one" / a["hidden_file"]).read_bytes() == (tmp_path / "sharded" / b["hidden_file"]).read_bytes()
    assert {p["device"]["index"] for p in many["prompts"]} == {0, 1}  # both workers recorded
    assert len(many["environment"]["devices"]) == 2
    assert many["overhead"]["ar_ratio_device"] in many["environment"]["devices"]
    assert one["overhead"]["steps_fitted"] == many["overhead"]["steps_fitted"]  # the same steps, in one fit
    same = {k for k in one["environment"] if k != "devices"}
    assert {k: one["environment"][k] for k in same} == {k: many["environment"][k] for k in same}

    before = (tmp_path / "sharded" / "trace.json").read_bytes()
    again = _record(config, tmp_path / "sharded", "--ray", "--workers", "2")
    assert again.exit_code == 0, again.output
    assert "nothing recorded" in again.output and (tmp_path / "sharded" / "trace.json").read_bytes() == before
    other = demo_config(tmp_path, settings="stop_at_eos = false", name="other.toml")  # another experiment
    recorded = _record(other, tmp_path / "sharded")
    assert recorded.exit_code == 0 and "nothing recorded" not in recorded.output, recorded.output


def test_a_lost_node_stops_the_recording_and_the_rerun_records_only_the_rest(tmp_path, local_ray, lose_node):
    from specframe.replay.trace import Trace

    config = demo_config(tmp_path)
    out = tmp_path / "trace"
    lost = {"on": True}
    kept = lambda: sorted(tmp_path.glob(".trace.partial-*/questions/*.json"))  # noqa: E731
    lose_node(lambda: lost["on"] and len(kept()) >= 1)
    result = _record(config, out, "--ray", "--workers", "2")
    assert result.exit_code == 1
    errors = [line for line in result.output.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and "was lost mid-job: the cluster marked it dead" in errors[0], result.output
    assert "record only the rest" in errors[0] and not (out / "trace.json").exists()
    first = kept()
    assert 1 <= len(first) < 3

    lost["on"] = False
    again = _record(config, out, "--ray", "--workers", "2")
    assert again.exit_code == 0, again.output
    # rich wraps the progress line at the console's width
    assert f"({len(first)} of 3 questions kept from the last try)" in " ".join(again.output.split())
    trace = Trace.load(out)  # hidden files checked against their entries
    assert len(trace.prompts) == 3 and all(p.hidden_file for p in trace.prompts.values())
    assert not list(tmp_path.glob(".trace.partial-*"))  # the kept questions went into the trace


def test_workers_on_unlike_devices_are_refused_in_one_line():
    from specframe.errors import ExperimentError
    from specframe.replay.sharded_record import one_kind

    cpu = {"host": "a", "kind": "cpu", "name": "EPYC", "index": 0, "threads": 1}
    gpu = {"host": "b", "kind": "cuda", "name": "NVIDIA H100", "index": 0}
    assert one_kind([cpu, dict(cpu, host="c", index=1)]) == "cpu EPYC, 1 thread(s)"
    with pytest.raises(ExperimentError, match=r"^the Ray workers hold devices of 2 kinds \(.*\): a trace has one "
                                              r"cost curve[^\n]*$"):
        one_kind([cpu, gpu])
