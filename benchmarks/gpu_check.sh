#!/usr/bin/env bash
# GPU device check (issue 7).  Installs nothing from the network: the GPU image brings
# torch/transformers/peft (and vLLM, if the image has it); the few pure-Python wheels it
# lacks come from .wheels/ (make it here with benchmarks/gpu_wheels.sh, carry it).
#
#   device run:  bash benchmarks/gpu_check.sh            (carry: [".wheels"])
#   options go to gpu_check.py, e.g. --arch qwen2.5-7b, --model-path DIR, --backend hf
#
# Prints tokens/s for generation (vLLM when importable, else transformers), scoring and
# training (full and LoRA, bf16 autocast, activation checkpointing), peak GPU memory, and
# runs the quickstart pipeline for two RL steps on the GPU.  JSON + log go to $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
PY=${PYTHON:-python3}
OUTDIR=${OUT:-runs/gpu_check}
mkdir -p "$OUTDIR"
if ! $PY -c "import gymnasium, omegaconf" 2>/dev/null; then
    $PY -m pip install -q --no-index --no-deps .wheels/*.whl || { echo "missing .wheels/"; exit 2; }
fi
$PY -m pip install -q --no-index --no-deps --no-build-isolation . || exit 2
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>/dev/null || true
cd /tmp  # import the installed package, not the source tree
$PY "$OLDPWD/benchmarks/gpu_check.py" --out "$OUTDIR/gpu_check.json" "$@" 2>&1 \
    | tee "$OUTDIR/gpu_check.log"
exit "${PIPESTATUS[0]}"
