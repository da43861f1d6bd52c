#!/usr/bin/env bash
# Fetch the Karpenter CRDs (pkg/apis/crds of github.com/aws/karpenter-provider-aws)
# of the versions pinned in tools/versions.env, from the Go module proxy, into
#   ${FSDP_TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/fsdp-k8s}/karpenter-<version>/crds/
# A version already there is a fast no-op. Prints nothing but log lines on stderr.
#
# Usage: tools/fetch-karpenter-crds.sh [--print-path VERSION_VARIABLE]
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=versions.env
source "$HERE/versions.env"
CACHE_ROOT=${FSDP_TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/fsdp-k8s}
MODULE=github.com/aws/karpenter-provider-aws
VARIABLES=(KARPENTER_MIN_VERSION KARPENTER_TOO_OLD_VERSION)

log() { printf '[fetch-karpenter-crds] %s\n' "$*" >&2; }
crds_dir() { printf '%s/karpenter-%s/crds\n' "$CACHE_ROOT" "${!1}"; }

if [[ ${1:-} == --print-path ]]; then crds_dir "$2"; exit 0; fi

# The module zip straight from the Go module proxy (`go mod download` would also
# insist on the Go version the module's go.mod asks for, which we never build with).
PROXY=${GOPROXY:-https://proxy.golang.org}
PROXY=${PROXY%%,*}
for var in "${VARIABLES[@]}"; do
  dest=$(crds_dir "$var")
  if compgen -G "$dest/*.yaml" >/dev/null; then continue; fi
  version=${!var}
  log "downloading $MODULE@$version from $PROXY"
  mkdir -p "$(dirname "$dest")"
  stage=$(mktemp -d "$(dirname "$dest")/stage.XXXXXX")
  curl -fsSL --retry 3 -o "$stage/module.zip" "$PROXY/$MODULE/@v/$version.zip"
  python3 - "$stage/module.zip" "$MODULE@$version/pkg/apis/crds/" "$stage" <<'PY'
import sys, zipfile
archive, prefix, out = sys.argv[1:]
with zipfile.ZipFile(archive) as z:
    names = [n for n in z.namelist() if n.startswith(prefix) and n.endswith(".yaml") and "/" not in n[len(prefix):]]
    if not names:
        sys.exit(f"no {prefix}*.yaml in {archive}")
    for n in names:
        with open(f"{out}/{n[len(prefix):]}", "wb") as f:
            f.write(z.read(n))
PY
  rm -f "$stage/module.zip"
  rm -rf "$dest" && mv "$stage" "$dest"
  log "  $(find "$dest" -name '*.yaml' | wc -l) CRD files -> $dest"
done
