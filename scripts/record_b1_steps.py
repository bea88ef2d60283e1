"""Record the per-step shape of one-sequence decoding for every built-in policy x drafter.

The file it writes (tests/data/b1_steps.json) pins what ``SpecDecoder.generate`` decides on the
tiny float64 target: tests/test_batch.py checks that the engine still takes exactly these
steps. Written by the engine of a given commit, so a change to the step that alters any tree,
acceptance or draft count shows up as a diff against it. Uses only names every version of the
engine exports (``specframe.SpecDecoder``, ``specframe.TargetModel``, the testing fixtures).

    python scripts/record_b1_steps.py tests/data/b1_steps.json
    python scripts/record_b1_steps.py tests/data/b1_steps.json --only layerskip   # add one plugin's pairs

``--only NAME`` records the pairs of policy or drafter NAME alone and adds them to the existing file,
leaving every earlier pair as it was.
"""

from __future__ import annotations

import json
import sys

import specframe
from specframe.testing.fixtures import default_drafter, tiny_target

PROMPTS = [[5, 9, 2], [7], [11, 3, 3, 8, 1, 40]]
MAX_NEW = 10
EOS = 17  # a token the tiny target emits, so some prompts stop early


#: The acceptance vector sequoia is recorded with (specframe.testing.fixtures.SEQUOIA_TEST_ACCEPTANCE).
SEQUOIA_ACCEPTANCE = [0.55, 0.15, 0.07, 0.04, 0.03, 0.02, 0.015, 0.01]
#: The distribution whose plugins are recorded: only the built-ins, so the file never names a
#: plugin that happened to be installed where it was written.
BUILTIN_DIST = "specframe"


def policy_spec(name: str) -> object:
    """The fixed-budget options tests/test_batch.py decodes each policy with."""
    if name in ("chain", "static"):
        return name
    if name == "sequoia":
        return (name, {"acceptance": SEQUOIA_ACCEPTANCE})
    if name == "sampled-tree":
        return (name, {"budget": 6, "seed": 0})
    return (name, {"budget": 6})


def builtin_names(kind: str) -> list[str]:
    """The names of the built-in plugins of ``kind`` (registered by the specframe distribution).
    Filtered here rather than by ``Registry.names(kind, dist=...)``: the script must run on the
    engines of earlier commits, whose ``names`` takes no distribution."""
    return sorted(info.name for info in specframe.get_registry().infos(kind) if info.dist == BUILTIN_DIST)


def record(only: str | None = None) -> dict:
    """``"policy x drafter" -> [per prompt: {"tokens", "steps"}]`` (only the pairs of the policy or
    drafter named ``only``, if given)."""
    out = {}
    for policy in builtin_names("policies"):
        for drafter in builtin_names("drafters"):
            if only is not None and only not in (policy, drafter):
                continue
            runs = []
            for prompt in PROMPTS:
                target = specframe.TargetModel(tiny_target())
                dec = specframe.SpecDecoder.build(target, drafter=default_drafter(drafter, target),
                                                  policy=policy_spec(policy), verifier="greedy")
                result = dec.generate(prompt, max_new_tokens=MAX_NEW, eos_token_id=EOS)
                runs.append({"tokens": result.tokens, "steps": [
                    [s.tree_size, s.depth, s.accepted, s.emitted, s.draft_forwards, s.widths, s.accepted_ranks,
                     s.budget_cut] for s in result.steps]})
            out[f"{policy} x {drafter}"] = runs
    return out


if __name__ == "__main__":
    args = sys.argv[1:]
    only = args[args.index("--only") + 1] if "--only" in args else None
    args = [a for i, a in enumerate(args) if a != "--only" and (i == 0 or args[i - 1] != "--only")]
    path = args[0] if args else "tests/data/b1_steps.json"
    if only is not None:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
        added = record(only)
        added = {pair: runs for pair, runs in added.items() if pair not in data["runs"]}  # earlier pairs stay
        data["runs"] = dict(sorted({**data["runs"], **added}.items()))
        with open(path, "w", encoding="utf-8") as fh:
            json.dump(data, fh, indent=None)
            fh.write("\n")
        print(f"added {len(added)} pairs of {only} to {path}")
        sys.exit(0)
    with open(path, "w", encoding="utf-8") as fh:
        json.dump({"prompts": PROMPTS, "max_new_tokens": MAX_NEW, "eos": EOS, "runs": record()}, fh, indent=None)
        fh.write("\n")
    print(f"wrote {path}")
