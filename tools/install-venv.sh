#!/usr/bin/env bash
# The project's virtualenv (.venv): every package (API, operator, trainer, local cluster)
# with all extras, installed from the wheelhouse alone (tools/wheelhouse.sh): no second
# download of what the image builds also install.
#
# --no-compile: pip would byte-compile all of torch, transformers and the rest (tens of
# thousands of files, most never imported); Python compiles what is imported, once, on
# first use instead.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(dirname "$HERE")
PYTHON=${PYTHON:-python3}
VENV=${VENV:-$ROOT/.venv}

WHEELS=$(bash "$HERE/wheelhouse.sh" --path)
[ -f "$WHEELS/.complete" ] || bash "$HERE/wheelhouse.sh"
"$PYTHON" -m venv "$VENV"
cd "$ROOT"
"$VENV/bin/pip" install --quiet --disable-pip-version-check --no-index --find-links "$WHEELS" --no-compile \
  -e '.[operator,trainer,dev]'
# The GPU bench's torchtitan reference: its own requirements are not ours (the file says why).
"$VENV/bin/pip" install --quiet --disable-pip-version-check --no-index --find-links "$WHEELS" --no-compile \
  --no-deps -r bench/torchtitan-requirements.txt
