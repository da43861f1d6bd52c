"""The embedded corpus and the embedded byte-level BPE tokenizer shipped with the package."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from fsdp_trainer.data.corpus import build_documents_cleanly, embedded_documents
from fsdp_trainer.data.tokenizer import ASSET_DIR, EMBEDDED_VOCAB_SIZE, build_bpe_tokenizer


def test_embedded_corpus_is_prose_without_local_details() -> None:
    docs = embedded_documents()
    assert docs == build_documents_cleanly()  # the cache holds exactly what a fresh build gives
    text = "\n".join(docs)
    assert len(docs) > 300 and len(text) > 1_000_000
    assert sorted(len(d) for d in docs)[len(docs) // 2] <= 4000  # cut at paragraphs into ~4 kB documents
    assert "The " in text and "Return" in text
    for leak in (sys.prefix, sys.base_prefix, "environ(", " at 0x"):
        assert leak not in text


def test_shipped_tokenizer_is_the_embedded_bpe() -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(ASSET_DIR)
    assert len(tok) == EMBEDDED_VOCAB_SIZE
    assert (tok.bos_token, tok.eos_token) == ("<|begin_of_text|>", "<|end_of_text|>")
    sample = "Return a new list containing all items from the iterable in ascending order."
    ids = tok(sample, add_special_tokens=False)["input_ids"]
    assert tok.decode(ids) == sample
    assert len(ids) < len(sample.split()) * 1.5  # merges learned from the corpus, not bytes


def test_bpe_builder_learns_a_vocabulary() -> None:
    docs = embedded_documents()[:40]
    tok = build_bpe_tokenizer(docs, vocab_size=600)
    assert len(tok) == 600
    text = docs[3][:300]
    assert tok.decode(tok(text)["input_ids"]) == text  # byte-level: lossless
    assert len(tok(text)["input_ids"]) < len(text.encode()) / 2


def test_a_fresh_home_reads_the_environments_corpus_instead_of_rendering_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pod's HOME is an empty volume: the copy beside the venv (or image) spares each process a render."""
    from fsdp_trainer.data import corpus

    renders: list[int] = []

    def render() -> list[str]:
        renders.append(1)
        return ["a document"]

    monkeypatch.setattr(corpus, "build_documents_cleanly", render)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setattr(sys, "prefix", str(tmp_path / "venv"))
    monkeypatch.setattr(sys, "base_prefix", "/usr")
    monkeypatch.setenv("HOME", str(tmp_path / "pod-1"))
    assert corpus.embedded_documents() == ["a document"] and len(renders) == 1
    (written,) = (tmp_path / "venv" / "share" / "fsdp-k8s").glob("corpus-*.json")
    # A venv made before this copy existed, with the user cache's: that one is copied beside the venv.
    (tmp_path / "pod-1" / ".cache").mkdir(parents=True)
    written.parent.rename(tmp_path / "pod-1" / ".cache" / "fsdp-k8s")
    assert corpus.embedded_documents() == ["a document"] and len(renders) == 1 and written.exists()
    assert oct(written.stat().st_mode & 0o777) == "0o644"  # readable by a pod's non-root user

    monkeypatch.setenv("HOME", str(tmp_path / "pod-2"))  # the next pod: another empty HOME
    assert corpus.embedded_documents() == ["a document"] and len(renders) == 1
    assert not (tmp_path / "pod-2").exists()

    # Outside a virtual environment nothing is written beside the interpreter: the user cache only.
    monkeypatch.setattr(sys, "prefix", str(tmp_path / "system"))
    monkeypatch.setattr(sys, "base_prefix", str(tmp_path / "system"))
    assert corpus.embedded_documents() == ["a document"] and len(renders) == 2
    assert not (tmp_path / "system").exists()
    assert list((tmp_path / "pod-2" / ".cache" / "fsdp-k8s").glob("corpus-*.json"))


def test_install_writes_the_environments_copy_or_says_why_not(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from fsdp_trainer.data import corpus

    monkeypatch.setattr(corpus, "build_documents_cleanly", lambda: ["a document"])
    monkeypatch.setattr(sys, "prefix", str(tmp_path / "venv"))
    assert json.loads(corpus.install().read_text()) == ["a document"]
    blocked = tmp_path / "file"
    blocked.write_text("")
    monkeypatch.setattr(sys, "prefix", str(blocked))  # share/ cannot be made below a file
    with pytest.raises(SystemExit, match=r"fsdp-train: cannot write the embedded corpus to .*/file/share/fsdp-k8s/"):
        corpus.install()


def test_the_image_builds_command_renders_the_corpus_beside_the_environment() -> None:
    """What the Dockerfile runs (``python -m fsdp_trainer.data.corpus``); it failed there once: its fresh
    interpreter was told to import ``__main__``."""
    import subprocess

    from fsdp_trainer.data import corpus

    out = subprocess.run(
        [sys.executable, "-m", "fsdp_trainer.data.corpus"], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-2000:]
    place = corpus._cache_files()[0]
    assert out.stdout.strip() == f"embedded corpus written to {place}"
    assert json.loads(place.read_text()) == corpus.build_documents_cleanly()
