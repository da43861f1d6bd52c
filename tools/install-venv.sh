#!/usr/bin/env bash
# The project's virtualenv (.venv): every package (API, operator, trainer, local cluster)
# with all extras, installed from the wheelhouse alone (tools/wheelhouse.sh): no second
# download of what the image builds also install.
#
# pip bootstraps uv (pinned in pyproject.toml's dev extra, in the wheelhouse like the rest),
# and uv installs the rest: it unpacks each wheel once into its cache, under the tools cache
# (${FSDP_TOOLS_CACHE:-~/.cache/fsdp-k8s}/uv), and hardlinks it into every later venv, so a
# clean clone's venv takes seconds instead of pip's minute of unpacking torch and the CUDA
# wheels again (docs/e2e.md, "Set-up"). Like pip's --no-compile, uv byte-compiles nothing:
# Python compiles what is imported, once, on first use.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(dirname "$HERE")
PYTHON=${PYTHON:-python3}
VENV=${VENV:-$ROOT/.venv}
CACHE_ROOT=${FSDP_TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/fsdp-k8s}
export UV_CACHE_DIR=${UV_CACHE_DIR:-$CACHE_ROOT/uv}

WHEELS=$(bash "$HERE/wheelhouse.sh" --path)
[ -f "$WHEELS/.complete" ] || bash "$HERE/wheelhouse.sh"
"$PYTHON" -m venv "$VENV"
cd "$ROOT"
uv_pin=$("$PYTHON" -c '
import tomllib
dev = tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["dev"]
print(next(r for r in dev if r.startswith("uv==")))')
"$VENV/bin/pip" install --quiet --disable-pip-version-check --no-index --find-links "$WHEELS" "$uv_pin"
install=("$VENV/bin/uv" pip install --quiet --python "$VENV/bin/python" --offline --no-index --find-links "$WHEELS")
"${install[@]}" -e '.[operator,trainer,dev]'
# The GPU bench's torchtitan reference: its own requirements are not ours (the file says why).
"${install[@]}" --no-deps -r bench/torchtitan-requirements.txt
