#!/usr/bin/env bash
# Debian packages used as real components by the tests: Prometheus (scrapes a
# real trainer run) and promtool (checks and unit-tests the alert rules);
# buildah and debootstrap build the images (tools/build-images.sh), podman
# and runc run containers from them (the node agent's image mode); containerd
# and the CNI plugins run the real kubelet's node (fsdp_localcluster/kubelet_node.py);
# envsubst runs the quickstart's own commands (tests/bundle/test_bundle_quickstart.py).
set -euo pipefail
need=()
command -v prometheus >/dev/null || need+=(prometheus)
command -v promtool >/dev/null || need+=(prometheus)
command -v openssl >/dev/null || need+=(openssl)
command -v buildah >/dev/null || need+=(buildah)
command -v podman >/dev/null || need+=(podman)
command -v runc >/dev/null || [ -x /usr/sbin/runc ] || need+=(runc)
command -v debootstrap >/dev/null || [ -x /usr/sbin/debootstrap ] || need+=(debootstrap)
command -v containerd >/dev/null || need+=(containerd)
[ -x /usr/lib/cni/bridge ] || need+=(containernetworking-plugins)
command -v envsubst >/dev/null || need+=(gettext-base)
if [ ${#need[@]} -eq 0 ]; then exit 0; fi
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO=sudo
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
# The package starts a system Prometheus on :9090; tests run their own.
$SUDO systemctl disable --now prometheus >/dev/null 2>&1 || true
pkill -x prometheus 2>/dev/null || true
