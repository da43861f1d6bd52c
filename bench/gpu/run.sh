#!/usr/bin/env bash
# Run on the GPU machine from the repository root, .whl/ carried (bench/gpu/wheels.sh):
# installs the carried wheels beside the machine's own torch and transformers, puts this
# checkout's packages on the path and runs the GPU benchmark. Arguments go to
# bench/trainer_throughput.py (default: --gpu --quick). Output also lands in $OUT/bench-gpu.log.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit
export PYTHONPATH="/tmp/site:$PWD/api:$PWD/trainer:$PWD/localcluster:$PWD" PYTHONUNBUFFERED=1
# The final checkpoint of each run goes to local memory, not the machine's disk.
export TMPDIR=/dev/shm
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
args=("$@")
[ ${#args[@]} -gt 0 ] || args=(--gpu --quick)
python3 bench/trainer_throughput.py "${args[@]}" 2>&1 | tee "${OUT:-/tmp}/bench-gpu.log"
