#!/usr/bin/env bash
# Build the Dockerfile's two targets (trainer, operator) here, unchanged, with
# buildah, for the image tests and the whole-cluster tests that run pods from
# them (docs/images.md).
#
# The registries' bases (nvidia/cuda, python:*-slim) cannot be pulled on a
# machine that reaches only package registries, so both bases are one local
# image: Debian bookworm with its Python 3.11 (the major/minor of the pinned
# python:3.11-slim-bookworm), made with debootstrap from the Debian mirror apt
# already uses. The EFA installer cannot be fetched either: INSTALL_EFA=false.
# Everything else (the pip installs, users, entrypoints) is the real build.
#
# Cached like the Go binaries: the base is made once; each target is tagged
# with a hash of what its build reads, so a run whose inputs are unchanged is
# a no-op, and a source edit reuses buildah's cached dependency layer.
#
# Usage: tools/build-images.sh [trainer] [operator]   (default: both; the base
# and the pod sandbox image for the real-kubelet test are made either way)
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(dirname "$HERE")
# shellcheck source=versions.env
source "$HERE/versions.env"
log() { echo "[build-images] $*" >&2; }

for tool in buildah debootstrap; do
  command -v "$tool" >/dev/null || { log "$tool is missing: run 'make system-deps'"; exit 1; }
done

exists() { buildah inspect --type image "$1" >/dev/null 2>&1; }

# --- the local base ---------------------------------------------------------
make_base() {
  exists "$LOCAL_BASE_IMAGE" && return 0
  # The first Debian mirror apt is configured with (deb822 or one-line form).
  local mirror
  mirror=$(grep -hoE '^URIs: *[^ ]+/debian$' /etc/apt/sources.list.d/*.sources 2>/dev/null | head -n1 | awk '{print $2}')
  [ -n "$mirror" ] || mirror=$(grep -hoE '^deb +[^ ]+/debian ' /etc/apt/sources.list 2>/dev/null | head -n1 | awk '{print $2}')
  [ -n "$mirror" ] || { log "no Debian mirror in /etc/apt/sources.list*: cannot debootstrap"; exit 1; }
  local root
  root=$(mktemp -d)
  trap 'rm -rf "$root"' RETURN
  log "debootstrap $LOCAL_BASE_SUITE (minbase + Python) into a new base image"
  # python-is-python3: the python:* images call it `python` (the operator stage does).
  debootstrap --variant=minbase --include=python3,python3-venv,python-is-python3,ca-certificates \
    "$LOCAL_BASE_SUITE" "$root" "$mirror" >/dev/null
  rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/* "$root"/var/log/*
  local ctr mnt
  ctr=$(buildah from scratch)
  mnt=$(buildah mount "$ctr")
  cp -a "$root"/. "$mnt"/
  buildah umount "$ctr" >/dev/null
  buildah config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin --cmd /bin/bash "$ctr"
  buildah commit --quiet --rm "$ctr" "$LOCAL_BASE_IMAGE" >/dev/null
}

# --- the pod sandbox image -----------------------------------------------------
# A real kubelet's containerd starts every pod with a "pause" container
# (registry.k8s.io/pause cannot be pulled here). This stand-in does what it
# does: holds the pod's namespaces and exits on SIGTERM/SIGINT. From the base.
make_pause() {
  exists "$LOCAL_PAUSE_IMAGE" && return 0
  log "making $LOCAL_PAUSE_IMAGE from the base"
  local ctr
  ctr=$(buildah from --pull=never "$LOCAL_BASE_IMAGE")
  buildah config --user 65535:65535 --cmd '[]' \
    --entrypoint '["python3", "-c", "import signal, sys\nfor s in (signal.SIGTERM, signal.SIGINT):\n    signal.signal(s, lambda *_: sys.exit(0))\nwhile True:\n    signal.pause()"]' \
    "$ctr"
  buildah commit --quiet --rm "$ctr" "$LOCAL_PAUSE_IMAGE" >/dev/null
}

# --- one target ---------------------------------------------------------------
# A hash of everything the target's build reads: the Dockerfile, the build
# context it copies, the base and this script.
inputs_hash() {
  local target=$1 pkg
  pkg=$([ "$target" = trainer ] && echo trainer || echo operator)
  (
    cd "$ROOT"
    {
      # Paths relative to the checkout: a clone elsewhere (CI's) must hash the same.
      sha256sum Dockerfile .dockerignore pyproject.toml tools/build-images.sh tools/versions.env
      find api "$pkg" -type f ! -path '*/__pycache__/*' ! -name '*.pyc' ! -path '*.egg-info/*' -print0 \
        | sort -z | xargs -0 sha256sum
      buildah inspect --type image --format '{{.FromImageID}}' "$LOCAL_BASE_IMAGE"
    } | sha256sum | cut -c1-16
  )
}

build_target() {
  local target=$1 image hash
  image=$([ "$target" = trainer ] && echo "$LOCAL_TRAINER_IMAGE" || echo "$LOCAL_OPERATOR_IMAGE")
  hash=$(inputs_hash "$target")
  local repo=${image%:*}
  if exists "$repo:$hash"; then
    buildah tag "$repo:$hash" "$image"
    log "up to date: $image ($hash)"
    return 0
  fi
  # pip inside the build reads a pip.conf mounted read-only, only while building, so
  # none of it enters a layer: the wheelhouse the virtualenv was installed from
  # (tools/wheelhouse.sh), as the only index, so torch and the CUDA wheels are not
  # downloaded a second time; and, on a machine whose TLS to the package index is
  # intercepted, the extra CA it trusts (PIP_CERT).
  local mounts=() tmp wheels
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' RETURN
  wheels=$(bash "$HERE/wheelhouse.sh" --path)
  [ -f "$wheels/.complete" ] || bash "$HERE/wheelhouse.sh"
  printf '[global]\nno-index = true\nfind-links = /run/wheels\n' > "$tmp/pip.conf"
  mounts+=(-v "$wheels:/run/wheels:ro")
  if [ -n "${PIP_CERT:-}" ] && [ -f "$PIP_CERT" ]; then
    printf 'cert = /run/build-ca.crt\n' >> "$tmp/pip.conf"
    mounts+=(-v "$PIP_CERT:/run/build-ca.crt:ro")
  fi
  mounts+=(-v "$tmp/pip.conf:/etc/pip.conf:ro")
  log "building $image ($hash)"
  local start=$SECONDS
  # --force-rm: a failed build (a full disk) must not leave its working container behind,
  # a copy of the venv that makes the next try fail the same way.
  buildah bud --layers --force-rm --pull=never --target "$target" \
    --build-arg "CUDA_BASE=$LOCAL_BASE_IMAGE" --build-arg "PYTHON_BASE=$LOCAL_BASE_IMAGE" \
    --build-arg INSTALL_EFA=false \
    "${mounts[@]}" -t "$repo:$hash" -t "$image" -f "$ROOT/Dockerfile" "$ROOT" >&2
  log "built $image in $((SECONDS - start)) s"
  # Older builds of this target: their last layers (a copy of the venv) are GBs each.
  # (A bare repository name is no image reference to `buildah images`: filter by reference.)
  buildah images --format '{{.Name}}:{{.Tag}}' --filter "reference=$repo" | grep -vE ":(local|$hash)$" \
    | xargs -r buildah rmi >/dev/null 2>&1 || true
}

targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(trainer operator)
make_base
make_pause
for t in "${targets[@]}"; do
  case "$t" in
    trainer|operator) build_target "$t" ;;
    *) log "unknown target $t (trainer, operator)"; exit 2 ;;
  esac
done
