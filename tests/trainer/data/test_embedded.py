"""The embedded corpus and the embedded byte-level BPE tokenizer shipped with the package."""

from __future__ import annotations

import platform
import sys
from pathlib import Path

import pytest
from fsdp_trainer.data.corpus import embedded_documents
from fsdp_trainer.data.tokenizer import ASSET_DIR, EMBEDDED_VOCAB_SIZE, build_bpe_tokenizer


def test_embedded_corpus_is_prose_without_local_details() -> None:
    docs = embedded_documents()
    text = "\n".join(docs)
    assert len(docs) == 482 and len(text) > 1_000_000  # what the shipped tokenizer was learned from
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


def test_every_python_trains_on_the_shipped_corpus_not_its_own_render(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """pydoc's text differs between Python versions (3.12: 490 documents, 3.11: 482): a render per
    install made the image's pods and a host run train on different text."""
    from fsdp_trainer.data import corpus

    def render() -> list[str]:
        raise AssertionError("rendered at run time")

    monkeypatch.setattr(corpus, "build_documents", render)
    monkeypatch.setattr(corpus, "build_documents_cleanly", render)
    monkeypatch.setenv("HOME", str(tmp_path / "pod"))
    assert corpus.embedded_documents() == embedded_documents()
    assert not (tmp_path / "pod").exists()  # nothing written for a pod's empty HOME either


def test_the_maintainers_command_writes_an_asset_the_trainer_reads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import subprocess

    from fsdp_trainer.data import corpus

    target = tmp_path / "corpus.json.xz"
    out = subprocess.run(
        [sys.executable, "-m", "fsdp_trainer.data.corpus", str(target)], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == f"embedded corpus rendered with Python {platform.python_version()} into {target}"
    monkeypatch.setattr(corpus, "ASSET", target)
    corpus._read_asset.cache_clear()
    try:
        docs = corpus.embedded_documents()
    finally:
        corpus._read_asset.cache_clear()
    assert len(docs) > 300 and all(docs)
    assert oct(target.stat().st_mode & 0o777) == "0o644"


def test_a_damaged_asset_is_one_line_naming_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from fsdp_trainer.data import corpus

    bad = tmp_path / "corpus.json.xz"
    bad.write_bytes(b"not xz")
    monkeypatch.setattr(corpus, "ASSET", bad)
    corpus._read_asset.cache_clear()
    try:
        expected = rf"^fsdp-train: the embedded corpus {bad} cannot be read \(.+\); reinstall"
        with pytest.raises(SystemExit, match=expected):
            corpus.embedded_documents()
    finally:
        corpus._read_asset.cache_clear()
