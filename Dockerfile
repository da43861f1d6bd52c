# syntax=docker/dockerfile:1
#
# Two images from one file:
#
#   docker build --target trainer  -t ghcr.io/fsdp-k8s/trainer:0.1.0 .
#   docker build --target operator -t ghcr.io/fsdp-k8s/operator:0.1.0 .
#
# Bases are pinned by tag; mirror them and pin by digest in production.
# Each image gets the API package and its own package only: the trainer image
# copies api/ and trainer/ and installs the `trainer` extra (no kopf, no
# aiohttp), the operator image copies api/ and operator/ and installs the
# `operator` extra (no torch, no trainer code).
# tests/bundle/test_bundle_dockerfile.py checks that against pyproject.toml,
# and hadolint lints this file.

# The torch wheel pinned in pyproject.toml brings its own CUDA user-space
# libraries (cuBLAS, cuDNN, NCCL) as pip packages; the base only has to match
# their CUDA version (13.2 for torch 2.15.0) so the node's driver requirement
# is the same. The test above checks that too.
ARG CUDA_BASE=nvidia/cuda:13.2.0-base-ubuntu24.04
ARG PYTHON_BASE=python:3.11.14-slim-bookworm
# EFA installer: libfabric with the EFA provider, rdma-core and the
# aws-ofi-nccl plugin that lets NCCL talk to EFA (installed to /opt/amazon).
# 1.51.0 ships aws-ofi-nccl 1.22.0 and libfabric 2.7.0 (AWS EC2 user guide,
# "Elastic Fabric Adapter release notes"); 1.50.0's aws-ofi-nccl 1.21.1 was
# tested with NCCL 2.31.2 (its release notes). The torch pin brings NCCL 2.30:
# tests/bundle/test_bundle_dockerfile.py keeps the two in step.
ARG EFA_INSTALLER_VERSION=1.51.0
# The real images install it; tools/build-images.sh turns it off, because a
# machine that reaches only package registries cannot fetch it (docs/images.md).
ARG INSTALL_EFA=true

# ---------------------------------------------------------------------------
# trainer: torchrun + FSDP2 on CUDA, EFA-capable
# ---------------------------------------------------------------------------
FROM ${CUDA_BASE} AS trainer-build
ARG DEBIAN_FRONTEND=noninteractive
# Ubuntu's Python (3.12 on 24.04); versions float with the pinned base image
# (apt version pins would break whenever the archive moves on).
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv \
 && rm -rf /var/lib/apt/lists/*
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python3 -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
WORKDIR /src
COPY pyproject.toml ./
# The dependencies get a layer of their own, built before any source is
# copied: with no package folders the project builds as an empty
# distribution, so editing the code reuses this layer (GBs of torch and CUDA
# libraries) and only the last step reruns. An empty README.md stands in for
# the one pyproject.toml names, here and in the project's own install below:
# the README is no part of either image, so a docs edit rebuilds neither (nor
# the tests' copy of the trainer image in a kubelet's containerd).
# Versions come from pyproject.toml, the project's only pin list (hadolint
# cannot see them behind the extra).
# hadolint ignore=DL3013
RUN touch README.md && pip install --no-cache-dir '.[trainer]'
# The project itself goes to /opt/fsdp, outside the venv, which finds it
# through a .pth file: the venv (GBs) then stays byte-identical across source
# edits, so the runtime stage's copy of it is cached too, and an edit rebuilds
# a layer of a few MB instead of copying the venv again (about 9 minutes
# here). One distribution holds both sides' console scripts: the operator's
# goes, this image does not carry its package.
RUN python -c "__import__('pathlib').Path(__import__('sysconfig').get_path('purelib'), 'fsdp-k8s.pth').write_text('/opt/fsdp')" \
 && rm /opt/venv/bin/fsdp-operator
COPY api/ api/
COPY trainer/ trainer/
# hadolint ignore=DL3013
RUN pip install --no-cache-dir --no-deps --target /opt/fsdp '.[trainer]' \
 && rm -rf /opt/fsdp/bin

FROM ${CUDA_BASE} AS trainer
ARG DEBIAN_FRONTEND=noninteractive
ARG EFA_INSTALLER_VERSION
ARG INSTALL_EFA
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# The EFA steps AWS documents for containers: no kernel module (the host has
# it), no ulimit config (the pod gets IPC_LOCK), no post-install check (no
# EFA device at build time).
# hadolint ignore=DL3008,DL3003
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 ca-certificates \
 && if [ "${INSTALL_EFA}" = true ]; then \
      apt-get install -y --no-install-recommends curl \
      && curl -fsSL "https://efa-installer.amazonaws.com/aws-efa-installer-${EFA_INSTALLER_VERSION}.tar.gz" \
           | tar -xz -C /tmp \
      && cd /tmp/aws-efa-installer \
      && ./efa_installer.sh -y --skip-kmod --skip-limit-conf --no-verify \
      && cd / && rm -rf /tmp/aws-efa-installer \
      && apt-get purge -y --auto-remove curl; \
    fi \
 && rm -rf /var/lib/apt/lists/*
# uid/gid 1000 and HOME=/home/trainer are what the rendered pods run as
# (runAsUser/runAsGroup 1000, an emptyDir on HOME); Ubuntu 24.04 images ship
# a user "ubuntu" with uid 1000, which is replaced.
RUN (userdel --remove ubuntu 2>/dev/null || true) \
 && groupadd --gid 1000 trainer \
 && useradd --uid 1000 --gid 1000 --home-dir /home/trainer --create-home --shell /usr/sbin/nologin trainer
COPY --from=trainer-build /opt/venv /opt/venv
# gcc, libc6-dev and libpython3-dev: torch.compile's Triton builds a small C
# launcher module (its backends/nvidia/driver.c, which includes Python.h) with
# the system C compiler the first time it runs on a node; without one, every
# compiled layer falls back to eager (tests/images/test_images.py builds it).
# A layer of its own after the venv's: adding it did not re-copy the venv (GBs).
# apt-get clean: a base without docker-clean's apt hook (tools/build-images.sh
# builds on a debootstrap one) would keep the downloaded .debs in the layer.
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends gcc libc6-dev libpython3-dev \
 && apt-get clean \
 && rm -rf /var/lib/apt/lists/*
COPY --from=trainer-build /opt/fsdp /opt/fsdp
ENV PATH=/opt/venv/bin:/opt/amazon/efa/bin:$PATH \
    LD_LIBRARY_PATH=/opt/amazon/ofi-nccl/lib/x86_64-linux-gnu:/opt/amazon/ofi-nccl/lib:/opt/amazon/efa/lib \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    HOME=/home/trainer \
    HF_HOME=/home/trainer/.cache/huggingface
USER 1000:1000
WORKDIR /home/trainer
# The PyTorchJob sets command [python] with the config check and the torchrun
# rendezvous flags; a bare `docker run --gpus all IMAGE` checks, then trains,
# the config mounted at /etc/fsdp on one node.
ENTRYPOINT ["python"]
CMD ["-m", "fsdp_trainer", "check", "--config", "/etc/fsdp/train.yaml", "--nproc-per-node", "gpu", "--", \
     "torchrun", "--standalone", "--nproc-per-node=gpu", "-m", "fsdp_trainer", "--config", "/etc/fsdp/train.yaml"]

# ---------------------------------------------------------------------------
# operator: kopf controller, no torch, read-only root filesystem
# ---------------------------------------------------------------------------
FROM ${PYTHON_BASE} AS operator-build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
WORKDIR /src
COPY pyproject.toml ./
# Dependencies first, in their own layer, as in the trainer stage.
# hadolint ignore=DL3013
RUN touch README.md && pip install --no-cache-dir '.[operator]'
COPY api/ api/
COPY operator/ operator/
# Byte-code is compiled here, at build time: the running container cannot
# write next to the sources (readOnlyRootFilesystem). The trainer's console
# script goes: this image does not carry its package.
# hadolint ignore=DL3013
RUN pip install --no-cache-dir --no-deps '.[operator]' \
 && rm /opt/venv/bin/fsdp-train \
 && python -m compileall -q /opt/venv

FROM ${PYTHON_BASE} AS operator
COPY --from=operator-build /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
# 65532: the conventional "nonroot" uid; no passwd entry or home is needed.
USER 65532:65532
ENTRYPOINT ["fsdp-operator"]
CMD ["run", "--all-namespaces"]
