"""The images ``make images`` builds from the Dockerfile (tools/build-images.sh), by their local names.

The names are written once, in tools/versions.env; the whole-cluster tests
run trainer pods from ``LOCAL_TRAINER_IMAGE`` in the node agent's image mode.
"""

from __future__ import annotations

import subprocess

from .binaries import REPO_ROOT


def _versions() -> dict[str, str]:
    pairs = {}
    for line in (REPO_ROOT / "tools" / "versions.env").read_text().splitlines():
        key, sep, value = line.partition("=")
        if sep and not line.startswith("#"):
            pairs[key.strip()] = value.strip()
    return pairs


_V = _versions()
LOCAL_TRAINER_IMAGE = _V["LOCAL_TRAINER_IMAGE"]
LOCAL_OPERATOR_IMAGE = _V["LOCAL_OPERATOR_IMAGE"]
LOCAL_PAUSE_IMAGE = _V["LOCAL_PAUSE_IMAGE"]  # the real-kubelet node's pod sandbox (kubelet_node)
# What the node agent runs from images: whatever `make images` built.
LOCAL_IMAGE_PATTERN = LOCAL_TRAINER_IMAGE.rsplit("/", 1)[0] + "/*"


def missing_images() -> list[str]:
    missing = []
    for image in (LOCAL_TRAINER_IMAGE, LOCAL_OPERATOR_IMAGE, LOCAL_PAUSE_IMAGE):
        try:
            found = subprocess.run(["podman", "image", "exists", image], capture_output=True).returncode == 0
        except FileNotFoundError:
            found = False
        if not found:
            missing.append(image)
    return missing


def require_images() -> None:
    """Fail with one line when the images are not built."""
    missing = missing_images()
    if missing:
        import pytest

        pytest.fail(f"{', '.join(missing)} not built: run 'make images' (tools/build-images.sh)", pytrace=False)
