"""The tiny example as `fsdp-operator render` gives it, shortened for the image tests."""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml
from fsdp_localcluster.binaries import REPO_ROOT


def render_tiny(max_steps: int, interval: int, image: str | None = None) -> dict[str, dict[str, Any]]:
    """The rendered objects by kind: ``max_steps`` at seqLen 64, a checkpoint each ``interval``."""
    source = yaml.safe_load((REPO_ROOT / "examples/fsdptraining-tiny.yaml").read_text())
    source["spec"]["training"].update(maxSteps=max_steps, seqLen=64)
    source["spec"]["checkpoint"] = {**source["spec"].get("checkpoint", {}), "intervalSteps": interval}
    if image is not None:
        source["spec"]["image"] = image
    with tempfile.NamedTemporaryFile("w", suffix=".yaml") as f:
        yaml.safe_dump(source, f)
        f.flush()
        out = subprocess.run(
            [str(Path(sys.executable).parent / "fsdp-operator"), "render", "-f", f.name],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    return {d["kind"]: d for d in yaml.safe_load_all(out) if d}


def worker_template(objects: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The PyTorchJob's worker pod template."""
    return objects["PyTorchJob"]["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]
