"""Code in a model or tokenizer directory (``auto_map``) never runs, even when someone answers "y" (issue 24, 8).

Without ``trust_remote_code=False`` transformers asks "Do you wish to run the
custom code? [y/N]" on stdin and runs it on "y" (``run-local`` inherits the
terminal). Here stdin answers "y" and the custom module would leave a marker.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.trainer.harness import base_config, offline_env


def _custom_module(directory: Path, module: str, marker: Path, body: str) -> None:
    (directory / f"{module}.py").write_text(f"import pathlib\npathlib.Path({str(marker)!r}).touch()\n{body}\n")


def _custom_model(directory: Path, marker: Path) -> Path:
    directory.mkdir()
    config = {
        "model_type": "fsdp_custom_test",
        "auto_map": {"AutoConfig": "configuration_custom.CustomConfig"},
    }
    (directory / "config.json").write_text(json.dumps(config))
    body = "from transformers import PretrainedConfig\nclass CustomConfig(PretrainedConfig):\n    model_type = 'x'"
    _custom_module(directory, "configuration_custom", marker, body)
    return directory


def _custom_tokenizer(directory: Path, tokenizer: Path, marker: Path) -> Path:
    shutil.copytree(tokenizer, directory)
    config_file = directory / "tokenizer_config.json"
    config = json.loads(config_file.read_text())
    config.pop("tokenizer_class", None)
    config["auto_map"] = {"AutoTokenizer": ["tokenization_custom.CustomTokenizer", None]}
    config_file.write_text(json.dumps(config))
    _custom_module(directory, "tokenization_custom", marker, "from transformers import PreTrainedTokenizerFast")
    return directory


@pytest.mark.slow  # a fresh Python importing torch (over the unit tier's limit, tests/slow_guard.py)
@pytest.mark.parametrize("where", ["model.architecture", "data.tokenizer"])
def test_custom_code_is_refused_in_one_line_even_if_answered_yes(
    tmp_path: Path, inputs: dict[str, Path], where: str
) -> None:
    marker = tmp_path / "ran"
    cfg = base_config(tmp_path, inputs["aligned"], inputs["tokenizer"])
    if where == "model.architecture":
        custom = _custom_model(tmp_path / "model", marker)
        cfg["model"] = {"architecture": str(custom)}
    else:
        custom = _custom_tokenizer(tmp_path / "tokenizer", inputs["tokenizer"], marker)
        cfg["data"]["tokenizer"] = str(custom)
    config = tmp_path / "train.yaml"
    config.write_text(yaml.safe_dump(cfg))
    proc = subprocess.run(
        [sys.executable, "-m", "fsdp_trainer", "check", "--config", str(config)],
        input="y\n",
        env=offline_env(),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert f"  {where}: " in proc.stderr and "needs custom code of its own (auto_map)" in proc.stderr, proc.stderr
    assert "Do you wish to run the custom code" not in proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    assert not marker.exists()
