"""tools/wheelhouse.sh: a new key (a pin added) starts from the last complete wheelhouse.

pip itself is replaced by a recorder (a stand-in interpreter that runs the script's
``-c`` snippets with the real Python and logs its ``-m pip download`` calls), so the
test sees what the folder held when pip was asked, with no network.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.bundle.manifests import REPO_ROOT

SCRIPT = REPO_ROOT / "tools" / "wheelhouse.sh"


def _recording_python(tmp_path: Path) -> Path:
    log = tmp_path / "pip.log"
    python = tmp_path / "python"
    python.write_text(
        "#!/usr/bin/env bash\n"
        'if [ "$1" = -m ]; then\n'
        '  dest=$(printf "%s\\n" "$@" | grep -A1 -- --dest | tail -1)\n'
        f'  echo "download into $dest: $(ls "$dest" | tr "\\n" " ")" >> {log}\n'
        "  exit 0\n"
        "fi\n"
        f'exec {sys.executable} "$@"\n'
    )
    python.chmod(0o755)
    return python


def _run(tmp_path: Path, cache: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "FSDP_TOOLS_CACHE": str(cache), "PYTHON": str(_recording_python(tmp_path))}
    return subprocess.run(
        ["bash", str(SCRIPT), *args], env=env, capture_output=True, text=True, timeout=60, check=False
    )


def test_a_new_key_starts_from_the_last_complete_wheelhouse_hardlinked(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    old = cache / "wheels" / "0000000000000000"
    old.mkdir(parents=True)
    (old / "torch-9.9-cp311-none-any.whl").write_bytes(b"a big wheel")
    (old / ".complete").touch()
    done = _run(tmp_path, cache)
    assert done.returncode == 0, done.stderr
    new = Path(_run(tmp_path, cache, "--path").stdout.strip())
    assert new != old and (new / ".complete").exists()
    # pip was asked with the old wheel already there, the same file (no second copy on disk).
    log = (tmp_path / "pip.log").read_text().splitlines()
    assert log[0] == f"download into {new}: torch-9.9-cp311-none-any.whl "
    assert (new / "torch-9.9-cp311-none-any.whl").stat().st_ino == (old / "torch-9.9-cp311-none-any.whl").stat().st_ino
    assert f"starting from {old}" in done.stderr


def test_an_incomplete_wheelhouse_is_not_a_starting_point(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    partial = cache / "wheels" / "1111111111111111"
    partial.mkdir(parents=True)
    (partial / "half-a-download.whl").write_bytes(b"")
    done = _run(tmp_path, cache)
    assert done.returncode == 0, done.stderr
    assert "starting from" not in done.stderr
    log = (tmp_path / "pip.log").read_text().splitlines()
    assert log[0].endswith(": ")  # an empty folder: everything is downloaded
