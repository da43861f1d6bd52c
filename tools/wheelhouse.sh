#!/usr/bin/env bash
# One download of every Python wheel the project installs, shared by the virtualenv
# (make setup) and both image builds (tools/build-images.sh mounts it into buildah),
# so torch and its CUDA wheels (about 3 GB) come over the network once, not twice.
#
#   tools/wheelhouse.sh          download what is missing; print nothing else
#   tools/wheelhouse.sh --path   print the wheelhouse's folder (downloads nothing)
#
# The folder is keyed on what decides its contents: pyproject.toml's pins, extras and
# build backend, bench/torchtitan-requirements.txt and the Python
# version, under the tools cache (${FSDP_TOOLS_CACHE:-~/.cache/fsdp-k8s}/wheels/KEY).
# A folder with its .complete stamp is a fast no-op; an interrupted download is
# finished by the next run; a new key starts from the last complete folder. The
# images' Python is the local base's (Debian bookworm's 3.11, tools/versions.env)
# and so takes the same cp311 wheels.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(dirname "$HERE")
PYTHON=${PYTHON:-python3}
CACHE_ROOT=${FSDP_TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/fsdp-k8s}

# Only pyproject.toml's tables that name packages count: a change to its tool settings or
# package folders keeps the wheelhouse (3 GB) where it is.
key=$(cd "$ROOT" && {
  "$PYTHON" -c '
import json, sys, tomllib
t = tomllib.load(open("pyproject.toml", "rb"))
p = t["project"]
print(json.dumps([t["build-system"], p.get("dependencies"), p.get("optional-dependencies")], sort_keys=True))
print(sys.implementation.cache_tag)'
  sha256sum bench/torchtitan-requirements.txt
} | sha256sum | cut -c1-16)
DIR=$CACHE_ROOT/wheels/$key

if [ "${1:-}" = --path ]; then echo "$DIR"; exit 0; fi
[ -f "$DIR/.complete" ] && exit 0

mkdir -p "$DIR"
# A new key (a pin added or changed) starts from the newest complete wheelhouse beside it,
# hardlinked: pip download keeps a file already in --dest, so only what changed comes over
# the network, not torch and the CUDA wheels again. The installs take pinned versions from
# it, so a wheel left over from the old pins is never picked.
previous=$(ls -td "$CACHE_ROOT"/wheels/*/.complete 2>/dev/null | head -1 || true)
if [ -n "$previous" ] && [ -z "$(ls -A "$DIR")" ]; then
  from=$(dirname "$previous")
  echo "[wheelhouse] starting from $from" >&2
  cp -l "$from"/* "$DIR"/ 2>/dev/null || cp "$from"/* "$DIR"/
fi
# The build backend too (pyproject.toml's [build-system] requires): installs from the
# wheelhouse alone (--no-index) build the project itself with it.
mapfile -t build_requires < <(cd "$ROOT" && "$PYTHON" -c '
import tomllib
print("\n".join(tomllib.load(open("pyproject.toml", "rb"))["build-system"]["requires"]))')
echo "[wheelhouse] downloading into $DIR" >&2
cd "$ROOT"
"$PYTHON" -m pip download --quiet --disable-pip-version-check --dest "$DIR" \
  '.[operator,trainer,dev]' "${build_requires[@]}"
# Installed with --no-deps (the file says why): downloaded the same way.
"$PYTHON" -m pip download --quiet --disable-pip-version-check --dest "$DIR" --no-deps \
  -r bench/torchtitan-requirements.txt
# The project's own sdist is not a wheel of the house: every install builds it from the checkout.
rm -f "$DIR"/fsdp_k8s-* "$DIR"/fsdp-k8s-*
touch "$DIR/.complete"
echo "[wheelhouse] $(find "$DIR" -name '*.whl' | wc -l) wheels, $(du -sh "$DIR" | cut -f1)" >&2
