"""What a REST datastore costs per step and buys in tau: the ``suffix`` drafter with and without one.

Decodes the prompts of a Spec-Bench-style file on a real target, once per arm, interleaved per
prompt, and prints per arm the mean and 90th-percentile draft time per step (the drafter's
lookups: ``StepStats.draft_time``) and tau. Build the datastore first, e.g. from Python's own
library sources::

    specframe datastore build $(python -c "import sysconfig; print(sysconfig.get_paths()['stdlib'])")/asyncio \\
        ... --tokenizer smollm2-135m-instruct --out /tmp/ds
    python benchmarks/datastore_lookup.py --datastore /tmp/ds --category coding
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--datastore", required=True)
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--prompts", default=str(ROOT / "examples" / "prompts" / "chat.jsonl"))
    parser.add_argument("--category", default=None, help="only this category's prompts")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--policy", default="talon")
    parser.add_argument("--budget", type=int, default=8)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    from transformers import AutoTokenizer

    from specframe.decode.engine import SpecDecoder
    from specframe.models.assets import resolve_model_path
    from specframe.models.target import TargetModel, load_causal_lm

    path = resolve_model_path(args.model)
    tok = AutoTokenizer.from_pretrained(path)
    target = TargetModel(load_causal_lm(path))
    rows = [json.loads(line) for line in Path(args.prompts).read_text().splitlines() if line.strip()]
    rows = [r for r in rows if args.category is None or r.get("category") == args.category]
    arms = {"suffix": {"global_tree": False}, "suffix+datastore": {"global_tree": False, "datastore": args.datastore}}
    decoders = {name: SpecDecoder.build(target, drafter=("suffix", opts), policy=(args.policy, {"budget": args.budget}))
                for name, opts in arms.items()}
    steps = {name: [] for name in arms}
    tokens = {name: 0 for name in arms}
    for row in rows:
        text = tok.apply_chat_template([{"role": "user", "content": row["turns"][0]}], add_generation_prompt=True,
                                       tokenize=False)
        ids = tok(text, add_special_tokens=False)["input_ids"]
        for name, dec in decoders.items():
            out = dec.generate(ids, max_new_tokens=args.max_new_tokens)
            steps[name] += out.steps
            tokens[name] += len(out.tokens)
    print(f"{len(rows)} prompts x {args.max_new_tokens} tokens, {args.model}, {args.policy} budget {args.budget}, "
          f"threads {args.threads}; datastore {args.datastore}")
    print(f"{'arm':18s} {'tau':>6s} {'draft ms/step':>14s} {'p90':>8s}")
    for name, ss in steps.items():
        ms = sorted(1e3 * s.draft_time for s in ss)
        print(f"{name:18s} {tokens[name] / len(ss):6.2f} {statistics.mean(ms):14.3f} {ms[int(0.9 * (len(ms) - 1))]:8.3f}")


if __name__ == "__main__":
    main()
