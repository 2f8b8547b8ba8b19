#!/usr/bin/env bash
# The one GPU window (docs/performance.md, "The GPU window"), under 8 minutes, a JSON line per
# measurement as it goes: the device and libraries, the decode engine's measurements
# (bench/decode_engine.py --device cuda --json-lines: eager vs graphed ms a step at 0.6B, merged
# vs unmerged, the merge on a role switch, tokens and logits against the eager decoder, the
# context sweep), then the 0.6B shape's training step and evaluation batch whole
# (bench/gpu_smoke.py, within what is left), then, while time is left, the GPU-only kernels'
# tests (TRL's Triton log-softmax, the update's attention) and the smoke test's cases.
#
#   bench/gpu_window.sh [WINDOW_S] [OUT_DIR]        # defaults: 480 s (8 minutes), .
#
# Plan on paper (H200): the 0.6B shape 37 s with its model (`bench/gpu_smoke.py --dry --shape
# qwen3-0.6b --budget-s 300`), starts and imports about 30 s; decode_engine.py keeps to what is
# left (its own plan, 50a's); the kernels' tests took 36 s with doctor on the last H200 node, the
# 16 cases 0.7-3.6 s each: about 4 minutes besides the engine's measurements.
# Writes OUT_DIR/gpu_window.log, OUT_DIR/gpu_window.jsonl (one JSON object a line) and
# OUT_DIR/gpu_smoke.json. A step's failure is reported and the next still runs.
set -u
window=${1:-480}
out=${2:-.}
mkdir -p "$out"
export HF_HUB_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1 PYTHONUNBUFFERED=1
began=$SECONDS
python=${PYTHON:-python3}
lines="$out/gpu_window.jsonl"
: > "$lines"
exec > >(tee "$out/gpu_window.log") 2>&1

step() { echo; echo "== $1 ($((SECONDS - began)) s into the window)"; }
left() { echo $((window - (SECONDS - began) - 10)); }  # 10 s: a script's own start

step "device and libraries"
"$python" - "$lines" <<'PY'
import importlib.metadata as md, json, platform, sys
def version(name):
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return "absent"
import torch
found = {"measurement": "device", "python": platform.python_version(), **{n: version(n) for n in ("torch", "transformers", "peft", "trl")},
         "cuda": torch.cuda.is_available(), "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"}
print(json.dumps(found))
open(sys.argv[1], "a").write(json.dumps(found) + "\n")
PY

step "the decode engine (bench/decode_engine.py)"
timeout "$(left)" "$python" bench/decode_engine.py --device cuda --json-lines | tee -a "$lines"

step "the 0.6B shape's training step and evaluation batch, within --budget-s $(left)"
"$python" bench/gpu_smoke.py --shape qwen3-0.6b --budget-s "$(left)" --json "$out/gpu_smoke.json" ${GPU_SMOKE_ARGS:-}
status=$?
"$python" - "$out/gpu_smoke.json" "$lines" <<'PY'
import json, sys
from pathlib import Path
found = json.loads(Path(sys.argv[1]).read_text()) if Path(sys.argv[1]).exists() else {}
for row in found.get("shapes", []):
    line = {"measurement": "shape", "shape": row["shape"], "failures": row["failures"], "skipped": row["skipped"],
            **{part: figures.get("seconds") for part, figures in row.get("measured", {}).items()}}
    print(json.dumps(line))
    open(sys.argv[2], "a").write(json.dumps(line) + "\n")
PY

if [ "$(left)" -gt 60 ]; then
    step "the GPU-only kernels: TRL's Triton log-softmax against the torch path, the update's attention without cuDNN's"
    timeout "$(left)" "$python" -m pytest tests/test_trl_triton.py tests/test_cuda_attention.py -q -rs -p no:cacheprovider
fi
if [ "$(left)" -gt 60 ]; then
    step "the smoke test's cases (pytest -m gpu)"
    timeout "$(left)" "$python" -m pytest tests/test_gpu_smoke.py -m gpu -q -rs -p no:cacheprovider
fi
step "done (exit $status)"
exit $status
