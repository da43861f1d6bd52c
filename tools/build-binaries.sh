#!/usr/bin/env bash
# Build the binaries of the test cluster (etcd, kube-apiserver, kubectl, helm,
# and on request kube-scheduler, kube-controller-manager, kubelet, training-operator, kueue,
# trainer-controller-manager, jobset, versitygw) from Go modules,
# using only the Go toolchain and the Go module proxy. Versions come from
# tools/versions.env. Results are cached under
#   ${FSDP_TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/fsdp-k8s}/<unit>/bin/<name>
# (<unit>: etcd-<version>, versitygw-<version>, or shared-<hash> for SHARED_BUILD)
# and a run whose binaries are all present is a fast no-op.
#
# Usage:
#   tools/build-binaries.sh [--jobs N] [NAME...]   build NAMEs (default: etcd kube-apiserver kubectl
#                                            helm), N modules at a time (default 1)
#   tools/build-binaries.sh --print-path NAME...   print where NAMEs live (builds nothing)
#   tools/build-binaries.sh --list           list the names this script knows
#
# Environment: GO (go binary; default `go` on PATH, else /usr/local/go/bin/go),
# FSDP_TOOLS_CACHE (cache root). The Go module and build caches stay in their
# default locations (GOMODCACHE, GOCACHE) so that every rebuild reuses them.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=versions.env
source "$HERE/versions.env"
CACHE_ROOT=${FSDP_TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/fsdp-k8s}

# The tool table: adding a binary is one line here (plus a *_VERSION line in
# versions.env if it comes from a module not yet listed). Tools that share a
# version variable come from the same module and are built by one `go build`,
# so they share its compile work; so do the modules of SHARED_BUILD below.
#   name                     version variable    module                      main package
TOOLS='
etcd                     ETCD_VERSION        go.etcd.io/etcd/server/v3   go.etcd.io/etcd/server/v3
kube-apiserver           KUBERNETES_VERSION  k8s.io/kubernetes           k8s.io/kubernetes/cmd/kube-apiserver
kubectl                  KUBERNETES_VERSION  k8s.io/kubernetes           k8s.io/kubernetes/cmd/kubectl
kube-scheduler           KUBERNETES_VERSION  k8s.io/kubernetes           k8s.io/kubernetes/cmd/kube-scheduler
kube-controller-manager  KUBERNETES_VERSION  k8s.io/kubernetes           k8s.io/kubernetes/cmd/kube-controller-manager
kubelet                  KUBERNETES_VERSION  k8s.io/kubernetes           k8s.io/kubernetes/cmd/kubelet
helm                     HELM_VERSION        helm.sh/helm/v3             helm.sh/helm/v3/cmd/helm
training-operator        TRAINING_OPERATOR_VERSION github.com/kubeflow/training-operator github.com/kubeflow/training-operator/cmd/training-operator.v1
kueue                    KUEUE_VERSION       sigs.k8s.io/kueue           sigs.k8s.io/kueue/cmd/kueue
trainer-controller-manager TRAINER_VERSION   github.com/kubeflow/trainer/v2 github.com/kubeflow/trainer/v2/cmd/trainer-controller-manager
jobset                   JOBSET_VERSION      sigs.k8s.io/jobset          sigs.k8s.io/jobset
versitygw                VERSITYGW_VERSION   github.com/versity/versitygw github.com/versity/versitygw/cmd/versitygw
'
DEFAULT_TOOLS=(etcd kube-apiserver kubectl helm)

# The modules compiled together, as one throwaway module that requires them all: the
# Kubernetes control plane, helm and the four controllers all stand on k8s.io/api,
# apimachinery, client-go (and the controllers on controller-runtime), which a build per
# module compiled five more times over; together they are compiled once. Go's minimal
# version selection then gives each shared dependency the highest version any of these
# modules requires (k8s.io/* v0.36.3, controller-runtime v0.24.1 at today's pins; Kueue
# v0.17.0 asks for v0.35.3 and v0.23.3 and builds and passes its tests on them), as a
# distribution building them against one dependency set would. On the 2-core machine, cold:
# 548 s for all ten binaries against 431 s for the five Kubernetes ones alone and
# about 15 minutes one module at a time (docs/e2e.md, "Set-up").
# etcd and versitygw keep builds of their own: little is shared, and their pins stay exact.
SHARED_BUILD=(KUBERNETES_VERSION HELM_VERSION TRAINING_OPERATOR_VERSION KUEUE_VERSION TRAINER_VERSION JOBSET_VERSION)

log() { printf '[build-binaries] %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

# field NAME N: column N (1-based) of NAME's row in the tool table.
field() {
  awk -v n="$1" -v i="$2" '$1 == n { print $i; found = 1 } END { exit !found }' <<<"$TOOLS" \
    || die "unknown binary '$1' (known: $(awk 'NF { printf "%s ", $1 }' <<<"$TOOLS"))"
}

# unit_of VAR: the build unit of the module pinned by VAR: "shared" (SHARED_BUILD) or VAR itself.
unit_of() {
  local var
  for var in "${SHARED_BUILD[@]}"; do [[ $var == "$1" ]] && { echo shared; return; }; done
  echo "$1"
}

# unit_vars UNIT: the version variables a unit builds.
unit_vars() { if [[ $1 == shared ]]; then echo "${SHARED_BUILD[@]}"; else echo "$1"; fi; }

# unit_dir UNIT: the unit's cache dir: .../etcd-v3.6.16, or .../shared-<hash of its pins> (any
# bump rebuilds the unit; the Go build cache keeps what did not change).
unit_dir() {
  local var short key=""
  for var in $(unit_vars "$1"); do
    [[ -n ${!var:-} ]] || die "$var is not set in $HERE/versions.env"
    key+="$var=${!var} "
  done
  if [[ $1 == shared ]]; then
    printf '%s/shared-%s\n' "$CACHE_ROOT" "$(sha256sum <<<"$key" | cut -c1-12)"
  else
    short=$(tr '[:upper:]' '[:lower:]' <<<"${1%_VERSION}")
    printf '%s/%s-%s\n' "$CACHE_ROOT" "$short" "${!1}"
  fi
}

# module_of VAR: the Go module pinned by VAR (column 3 of its tools' rows).
module_of() { awk -v v="$1" '$2 == v { print $3; exit }' <<<"$TOOLS"; }

bin_path() { printf '%s/bin/%s\n' "$(unit_dir "$(unit_of "$(field "$1" 2)")")" "$1"; }

# Version stamps that upstream's own release builds inject; without them the
# binaries report v0.0.0 and kubectl/helm print version-skew noise.
extra_ldflags() {
  local var=$1 v=${!1}
  case $var in
    KUBERNETES_VERSION)
      local mm=${v#v} p
      for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
        printf -- '-X %s.gitVersion=%s -X %s.gitMajor=%s -X %s.gitMinor=%s -X %s.gitTreeState=clean ' \
          "$p" "$v" "$p" "${mm%%.*}" "$p" "$(cut -d. -f2 <<<"$mm")" "$p"
      done ;;
    HELM_VERSION)
      # Offline commands (`helm template`, `helm lint`) assume this Kubernetes
      # version; upstream bakes in its client-go minor, we use the one we test on.
      local k=${KUBERNETES_VERSION#v} p
      printf -- '-X helm.sh/helm/v3/internal/version.version=%s -X helm.sh/helm/v3/internal/version.gitTreeState=clean ' "$v"
      for p in helm.sh/helm/v3/pkg/chartutil helm.sh/helm/v3/pkg/lint/rules; do
        printf -- '-X %s.k8sVersionMajor=%s -X %s.k8sVersionMinor=%s ' "$p" "${k%%.*}" "$p" "$(cut -d. -f2 <<<"$k")"
      done ;;
  esac
}

# sibling_version MODULE VERSION: the version at which MODULE's repo publishes
# the modules its go.mod replaces with local paths. Kubernetes publishes its
# staging modules (k8s.io/api, ...) as v0.<minor>.<patch>; other multi-module
# repos (etcd) tag all modules with the same version.
sibling_version() {
  if [[ $1 == k8s.io/kubernetes ]]; then printf 'v0.%s\n' "${2#v1.}"; else printf '%s\n' "$2"; fi
}

# upstream_gomod VAR: the go.mod of the module pinned by VAR, from the module proxy.
upstream_gomod() {
  local module version
  module=$(module_of "$1"); version=${!1}
  "$GO" list -m -f '{{.GoMod}}' "$module@$version" || die "cannot resolve $module@$version"
}

# replaces_of GOMOD MODULE VERSION: GOMOD's replace directives, restated for a main module
# that requires MODULE@VERSION. `go install pkg@version` refuses modules whose go.mod has
# replace directives (Kubernetes points every k8s.io/* staging module at ./staging/...),
# so local-path replaces become "same module at the sibling version" (only for modules
# actually required, as unrequired ones may be unpublished), other replaces are copied.
replaces_of() {
  awk -v sib="$(sibling_version "$2" "$3")" '
    { sub(/\/\/.*/, "") }
    /^require[ \t]*\($/ { blk = "req"; next }
    /^replace[ \t]*\($/ { blk = "rep"; next }
    /^\)/ { blk = ""; next }
    blk == "req" && NF >= 2 { req[$1] = 1; next }
    /^require[ \t]/ && NF >= 3 { req[$2] = 1; next }
    /^replace[ \t]/ { $1 = ""; reps[++n] = $0; next }
    blk == "rep" && /=>/ { reps[++n] = $0 }
    END {
      for (i = 1; i <= n; i++) {
        split(reps[i], side, "=>"); split(side[1], lhs, " "); split(side[2], rhs, " ")
        if (rhs[1] ~ /^\.\.?\//) { if (lhs[1] in req) printf "replace %s => %s %s\n", lhs[1], lhs[1], sib }
        else printf "replace %s => %s\n", lhs[1] (lhs[2] ? " " lhs[2] : ""), rhs[1] (rhs[2] ? " " rhs[2] : "")
      }
    }' "$1"
}

# write_gomod UNIT DIR: a throwaway main module that requires every module of UNIT at its
# pin, with their replaces. The go line is the highest any of them asks for, and the godebug
# lines are copied, so the build uses upstream's language version and GODEBUG defaults.
write_gomod() {
  local unit=$1 dir=$2 var gomod golines="" godebug="" requires="" replaces=""
  for var in $(unit_vars "$unit"); do
    gomod=$(upstream_gomod "$var")
    golines+="$(grep -E '^go ' "$gomod" | awk '{ print $2 }')"$'\n'
    godebug+="$(grep -E '^godebug ' "$gomod" || true)"$'\n'
    requires+="require $(module_of "$var") ${!var}"$'\n'
    replaces+="$(replaces_of "$gomod" "$(module_of "$var")" "${!var}")"$'\n'
  done
  replaces=$(sort -u <<<"$replaces" | sed '/^$/d')
  local conflicts
  conflicts=$(awk '{ print $2 }' <<<"$replaces" | sort | uniq -d)
  [[ -z $conflicts ]] || die "modules of one build replace $conflicts differently: build them apart"
  {
    printf 'module fsdp-k8s-tools/build\n\ngo %s\n' "$(sed '/^$/d' <<<"$golines" | sort -V | tail -n1)"
    sort -u <<<"$godebug" | sed '/^$/d'
    printf '\n%s\n%s\n' "$requires" "$replaces"
  } >"$dir/go.mod"
}

# build_unit UNIT NAME...: build the named tools (all from UNIT's modules) with one `go build`.
build_unit() {
  local unit=$1; shift
  local dir modules="" pkgs=() name pkg exe t0 t1 t2 var ldflags=""
  dir=$(unit_dir "$unit")
  for var in $(unit_vars "$unit"); do
    modules+="$(module_of "$var")@${!var} "
    ldflags+="$(extra_ldflags "$var")"
  done
  mkdir -p "$dir/src" "$dir/bin"
  # Serialise concurrent builders (e.g. parallel test sessions) per unit.
  exec 9>"$dir/.lock"
  flock 9
  local todo=()
  for name in "$@"; do [[ -x $dir/bin/$name ]] || todo+=("$name"); done
  if ((${#todo[@]} == 0)); then exec 9>&-; return; fi
  for name in "${todo[@]}"; do pkgs+=("$(field "$name" 4)"); done
  rm -rf "$dir"/stage.*   # left behind by an interrupted build

  log "building ${todo[*]} from ${modules% }"
  t0=$(date +%s)
  [[ -f $dir/src/go.mod ]] || write_gomod "$unit" "$dir/src"
  # Resolve the module graph and download sources first, so the timing below
  # separates network time from compile time.
  (cd "$dir/src" && "$GO" list -deps "${pkgs[@]}" >/dev/null)
  t1=$(date +%s)
  log "  modules resolved in $((t1 - t0))s; compiling (${#pkgs[@]} package(s), one go build)"
  local stage
  stage=$(mktemp -d "$dir/stage.XXXXXX")
  (cd "$dir/src" && "$GO" build -trimpath -ldflags="-s -w $ldflags" -o "$stage/" "${pkgs[@]}")
  # `go build -o dir/` names each binary after its package path, minus a
  # trailing /vN major-version element (go.etcd.io/etcd/server/v3 -> server).
  for name in "${todo[@]}"; do
    pkg=$(field "$name" 4)
    exe=${pkg##*/}
    [[ $exe =~ ^v[0-9]+$ ]] && exe=$(basename "$(dirname "$pkg")")
    mv -f "$stage/$exe" "$dir/bin/$name"   # rename is atomic: no half-written binary is ever visible
  done
  rm -rf "$stage"
  t2=$(date +%s)
  log "  built ${todo[*]} in $((t2 - t0))s (resolve $((t1 - t0))s, compile+link $((t2 - t1))s) -> $dir/bin"
  exec 9>&-
}

main() {
  case ${1:-} in
    --list) awk 'NF { print $1 }' <<<"$TOOLS"; return ;;
    --print-path) shift; for n in "$@"; do bin_path "$n"; done; return ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; return ;;
  esac
  JOBS=1
  if [[ ${1:-} == --jobs ]]; then JOBS=${2:?--jobs needs a number}; shift 2; fi
  [[ $JOBS =~ ^[1-9][0-9]*$ ]] || die "--jobs takes a positive number, not '$JOBS'"
  local names=("$@") n
  ((${#names[@]})) || names=("${DEFAULT_TOOLS[@]}")
  for n in "${names[@]}"; do field "$n" 1 >/dev/null; done   # reject unknown names early

  # Fast path: everything already built -> no Go needed at all.
  local missing=()
  for n in "${names[@]}"; do [[ -x $(bin_path "$n") ]] || missing+=("$n"); done
  if ((${#missing[@]} == 0)); then log "up to date: ${names[*]}"; return; fi

  GO=${GO:-$(command -v go || echo /usr/local/go/bin/go)}
  command -v "$GO" >/dev/null || die "the Go toolchain is needed to build ${missing[*]} (set GO=/path/to/go)"
  # -mod=mod lets go add the go.sum entries of the throwaway module; GOWORK=off
  # keeps any go.work around from interfering; CGO_ENABLED=0 gives static
  # binaries and needs no C compiler (upstream release builds do the same).
  export GOFLAGS=-mod=mod GOWORK=off CGO_ENABLED=0
  log "$("$GO" version); cache: $CACHE_ROOT"

  local start units=() unit
  start=$(date +%s)
  # Group by build unit, keeping first-seen order.
  for n in "${missing[@]}"; do
    unit=$(unit_of "$(field "$n" 2)")
    [[ " ${units[*]} " == *" $unit "* ]] || units+=("$unit")
  done
  # Up to JOBS units build at once, each one `go build` (which compiles on every core
  # itself): a second build fills the cores while the first resolves modules or links.
  local running=0 failed=0
  for unit in "${units[@]}"; do
    local group=()
    for n in "${missing[@]}"; do [[ $(unit_of "$(field "$n" 2)") == "$unit" ]] && group+=("$n"); done
    if ((running >= JOBS)); then wait -n || failed=1; running=$((running - 1)); fi
    build_unit "$unit" "${group[@]}" &
    running=$((running + 1))
  done
  while ((running > 0)); do wait -n || failed=1; running=$((running - 1)); done
  ((failed == 0)) || die "a build failed (its lines above)"
  log "done in $(($(date +%s) - start))s"
}

main "$@"; exit  # exit on the same line: edits made to this file during a long build are never read
