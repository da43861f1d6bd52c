"""The embedded corpus and the embedded byte-level BPE tokenizer shipped with the package."""

from __future__ import annotations

import sys

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
