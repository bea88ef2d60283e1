#!/usr/bin/env bash
# Installs the `parity` test extra and the reference implementations the parity tests compare
# specframe with (docs/parity.md). pip extras cannot say how these install, hence this script:
#
# - arctic-inference 0.3.0 (SuffixDecoding, vLLM's `suffix` method) builds only its CPU suffix
#   tree extension here (no CUDA, no vLLM), from source, against the build tools the extra
#   pins, so without build isolation;
# - eagle-llm 1.2.1 (EAGLE-1) and medusa-llm 0.1 (Medusa) pin old torch-era packages
#   (accelerate 0.21, protobuf 3.19, gradio, ...) that the tested modules never import, so
#   without their dependencies: torch and transformers stay as specframe has them;
# - lade 0.0.2 (Lookahead decoding) needs transformers 4.34, so without its dependencies: the
#   parity test loads its modules by file path with their transformers imports stubbed.
#
# Usage: bash scripts/install_parity.sh   (about 1.5 minutes on a 2-core machine)
set -euo pipefail
cd "$(dirname "$0")/.."
python -m pip install -e ".[test,parity]"
python -m pip install --no-deps --no-build-isolation arctic-inference==0.3.0
python -m pip install --no-deps eagle-llm==1.2.1 medusa-llm==0.1 lade==0.0.2
python -c "import importlib.util, arctic_inference.suffix_decoding, eagle.model.utils, medusa.model.utils; assert importlib.util.find_spec('lade'); print('parity references installed')"
