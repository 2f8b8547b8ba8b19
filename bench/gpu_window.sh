#!/usr/bin/env bash
# The whole GPU check in one window (docs/performance.md, "The GPU window"): the device and
# library versions, doctor on the offline node (as the grid is, then with only the models'
# config.json, which is what a memory plan needs), the tests of GPU-only kernels (TRL's Triton
# log-softmax, the update's attention without cuDNN's), then the
# smoke test's cases and the paper's three shapes within what is left of the window.
#
#   bench/gpu_window.sh [WINDOW_S] [OUT_DIR]        # defaults: 480 s (8 minutes), .
#
# Writes OUT_DIR/gpu_window.log (everything printed) and OUT_DIR/gpu_smoke.json. Each step's
# failure is reported and the next still runs; the exit status is the smoke test's.
# GPU_SMOKE_ARGS adds arguments to bench/gpu_smoke.py (the CPU test scales the shapes down).
# SHAPE_NEW_TOKENS (default 256) is the shapes' max_new_tokens: decoding is host-bound at about
# 100 ms a step on an H200 node, so the paper's 1,024 would take 6-8 minutes per training step
# alone; at 256 the three shapes fit the window, and each checks the same estimator that gives
# the paper's figures (docs/performance.md, "The GPU window").
set -u
window=${1:-480}
out=${2:-.}
mkdir -p "$out"
export HF_HUB_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1 PYTHONUNBUFFERED=1
began=$SECONDS
python=${PYTHON:-python3}
exec > >(tee "$out/gpu_window.log") 2>&1

step() { echo; echo "== $1 ($((SECONDS - began)) s into the window)"; }

step "device and libraries"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || echo "no nvidia-smi"
"$python" - <<'EOF'
import importlib.metadata as md, platform
names = ("torch", "transformers", "trl", "peft", "accelerate", "huggingface-hub", "tokenizers", "triton", "pydantic", "typer")
def version(name):
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return "absent"
print(f"python {platform.python_version()}; " + ", ".join(f"{n} {version(n)}" for n in names))
import torch
print(f"cuDNN {torch.backends.cudnn.version()}")
EOF

step "doctor, as examples/paper.yaml stands (offline: its model lines fail, the shapes need no model)"
timeout 120 "$python" -m matrixrl doctor -c examples/paper.yaml

step "doctor with only each model's config.json (what a memory plan reads)"
configs=$(mktemp -d)
"$python" - "$configs" <<'EOF'
import json, sys
from pathlib import Path
shapes = json.loads(Path("tests/fixtures/qwen3_configs.json").read_text())
for name, fields in shapes.items():
    if not name.startswith("_"):
        (Path(sys.argv[1]) / name).mkdir()
        (Path(sys.argv[1]) / name / "config.json").write_text(json.dumps({"model_type": "qwen3", **fields}))
EOF
timeout 120 "$python" -m matrixrl doctor -c examples/paper.yaml \
    --set "scales.qwen3-0.6b.path=$configs/qwen3-0.6b" --set "scales.qwen3-1.7b.path=$configs/qwen3-1.7b" \
    --set "scales.qwen3-4b.path=$configs/qwen3-4b"
rm -rf "$configs"

step "the GPU-only kernels: TRL's Triton log-softmax against the torch path, the update's attention without cuDNN's"
timeout 180 "$python" -m pytest tests/test_trl_triton.py tests/test_cuda_attention.py -q -rs -p no:cacheprovider

left=$((window - (SECONDS - began) - 10))  # 10 s: the smoke test's own start (imports, CUDA)
step "the smoke test: cases, then the shapes, within --budget-s $left"
tokens=${SHAPE_NEW_TOKENS:-256}
# shellcheck disable=SC2086  # GPU_SMOKE_ARGS is a list of words
"$python" bench/gpu_smoke.py --cases --shape qwen3-4b,qwen3-0.6b,qwen3-1.7b --budget-s "$left" \
    --set "train.max_new_tokens=$tokens" --set "eval.max_new_tokens=$tokens" --json "$out/gpu_smoke.json" ${GPU_SMOKE_ARGS:-}
status=$?
step "done (exit $status)"
exit $status
