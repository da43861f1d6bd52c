#!/usr/bin/env bash
# Run here, with network: the wheels the GPU machine lacks (Python 3.12, no internet),
# at this repository's pins, into .whl/ (git-ignored; carry it to the machine).
# The machine already has torch, transformers, peft, accelerate, prometheus-client,
# PyYAML, safetensors, tokenizers, pyarrow, pandas and xxhash.
set -euo pipefail
cd "$(dirname "$0")/../.."
pip=".venv/bin/python -m pip"
version() { .venv/bin/python -c "import importlib.metadata as m; print(m.version('$1'))"; }
rm -rf .whl && mkdir -p .whl
download() {
  $pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d .whl "$@"
}
for name in pydantic pydantic_core annotated-types typing-inspection datasets dill multiprocess torchao liger-kernel; do
  download "$name==$(version "$name")"
done
# The torchtitan reference of the bench, at its own pins (bench/torchtitan_llama.py).
download -r bench/torchtitan-requirements.txt
du -sh .whl
