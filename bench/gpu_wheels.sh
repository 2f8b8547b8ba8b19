#!/usr/bin/env bash
# Wheels for a GPU node without network, made where pip reaches PyPI (docs/real-models.md,
# "A GPU node without network"): the libraries the GPU check needs that the lent H200 node's
# image lacked, at the versions installed here (the ones the tests ran with), for the node's
# Python. torch is not among them: the node keeps its own CUDA build.
#
#   bench/gpu_wheels.sh [PYTHON_VERSION] [OUT_DIR]     # defaults: 3.12 (the node's), .whl
#
# Then, with the device tool, carry OUT_DIR (".whl" is git-ignored) and start the command with
#   python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
#       --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD HF_HUB_OFFLINE=1 || exit
# before bench/gpu_window.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
case ${1:-} in
    -h|--help) sed -n '2,12p' "$0" | cut -c3-; exit 0 ;;
    ""|[0-9]*) ;;
    *) echo "bench/gpu_wheels.sh: PYTHON_VERSION is a version such as 3.12, not '$1' (--help for usage)" >&2; exit 2 ;;
esac
python_version=${1:-3.12}
out=${2:-.whl}
# What the node lacked on 2026-12-03 (its image had torch 2.11+cu130, numpy, safetensors,
# tokenizers, jinja2, pyyaml, ...), matrixrl's and the GPU check's imports and their needs.
names=(
    transformers trl peft accelerate datasets dill multiprocess huggingface_hub hf-xet kernels
    httpx2 httpcore2 h11 anyio idna truststore click typer rich annotated-doc pydantic
    pydantic_core annotated-types typing-inspection SQLAlchemy greenlet setproctitle regex tqdm
    filelock fsspec packaging typing_extensions tomlkit
)
pins=$(python3 - "${names[@]}" <<'EOF'
import importlib.metadata as md
import sys

missing = []
for name in sys.argv[1:]:
    try:
        print(f"{name}=={md.version(name)}")
    except md.PackageNotFoundError:
        missing.append(name)
if missing:
    sys.exit(f"not installed here: {' '.join(missing)}; fix: pip install -e '.[dev,hub]' first, so the node gets the versions the tests ran with")
EOF
)
mkdir -p "$out"
# shellcheck disable=SC2086  # one requirement a word
python3 -m pip download --quiet --no-deps --only-binary=:all: --dest "$out" \
    --python-version "$python_version" --implementation cp --abi "cp${python_version/./}" --abi abi3 --abi none \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform any \
    $pins
echo "$(find "$out" -name '*.whl' | wc -l) wheels, $(du -sh "$out" | cut -f1), in $out"
