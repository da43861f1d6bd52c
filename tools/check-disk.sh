#!/usr/bin/env bash
# Warn, before the set-up starts, when the disk is too small for what it is about to write.
# Measured on the 2-core machine (docs/e2e.md, "Set-up"): a cold set-up writes about 40 GB at its
# peak (Go caches, the wheelhouse, the venv, buildah's layers) and keeps about 28; the suite then
# adds the real kubelet's copy of the trainer image and its temporary folders. A full disk shows up
# much later as "no space left on device" deep inside a Go build or a buildah commit. Warm, a
# rebuilt trainer image (a pyproject.toml or Dockerfile edit) still needs about 20 GB at once:
# buildah's copy of the venv layer, the new image beside the old, the kubelet's import of it
# (a warm run stopped at 23 GB free, 2026-12-03).
# Never fails the set-up: it only says so, in one line.
set -uo pipefail
CACHE_ROOT=${FSDP_TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/fsdp-k8s}
mkdir -p "$CACHE_ROOT" 2>/dev/null
free_gb=$(df -Pk "$CACHE_ROOT" 2>/dev/null | awk 'NR == 2 { printf "%d", $4 / 1048576 }')
[ -n "$free_gb" ] || exit 0
if [ -d "$CACHE_ROOT/wheels" ]; then need=25; what="a warm set-up and the suite"; else need=45; what="a cold set-up and the suite"; fi
if [ "$free_gb" -lt "$need" ]; then
  echo "[setup] WARNING: $free_gb GB free on the disk of $CACHE_ROOT; $what take about $need GB (docs/e2e.md, \"Set-up\")" >&2
fi
exit 0
