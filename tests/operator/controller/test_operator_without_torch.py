"""The operator image has no torch: every operator module must import without it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "fsdptraining-llama3.2-1b.yaml"

MODULES = [
    "fsdp_operator.cli",
    "fsdp_operator.crd",
    "fsdp_operator.render",
    "fsdp_operator.docs",
    "fsdp_operator.controller.main",
    "fsdp_operator.controller.handlers",
]


def test_operator_modules_import_with_torch_unavailable() -> None:
    # A None entry in sys.modules makes `import torch` raise ImportError, as in the slim image.
    code = (
        "import sys\n"
        "for blocked in ('torch', 'transformers', 'datasets'):\n"
        "    sys.modules[blocked] = None\n"
        f"for name in {MODULES!r}:\n"
        "    __import__(name)\n"
        "print('ok')\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


def test_cli_renders_with_torch_unavailable() -> None:
    code = (
        "import sys\n"
        "sys.modules['torch'] = None\n"
        "from fsdp_operator.cli import main\n"
        f"sys.exit(main(['render', '-f', {str(EXAMPLE)!r}]))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "kind: PyTorchJob" in result.stdout
