"""Offline inputs of the supervised-format tests: a chat tokenizer and conversation files.

The chat tokenizer is the harness's word tokenizer plus four role markers as
special tokens and a Jinja chat template. Two templates render the same text:
``PLAIN`` (assistant turns found by rendering prefixes) and ``GENERATION``
(the same with ``{% generation %}`` blocks around what the assistant says).
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

from tests.trainer.harness import NUM_WORDS, build_word_tokenizer

MARKERS = ["<|system|>", "<|user|>", "<|assistant|>", "<|end|>"]

PLAIN = (
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }} <|end|> {% endfor %}"
    "{% if add_generation_prompt %}<|assistant|> {% endif %}"
)
GENERATION = (
    "{{ bos_token }}{% for m in messages %}"
    "{% if m['role'] == 'assistant' %}<|assistant|> {% generation %}{{ m['content'] }} <|end|>{% endgeneration %} "
    "{% else %}<|{{ m['role'] }}|> {{ m['content'] }} <|end|> {% endif %}"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|> {% endif %}"
)


def build_chat_tokenizer(path: Path, template: str | None = PLAIN) -> Path:
    from transformers import AutoTokenizer

    build_word_tokenizer(path)
    tok = AutoTokenizer.from_pretrained(path)
    tok.add_special_tokens({"additional_special_tokens": MARKERS})
    if template is not None:
        tok.chat_template = template
    tok.save_pretrained(path)
    return path


def words(rng: random.Random, n: int) -> str:
    return " ".join(f"w{rng.randrange(NUM_WORDS)}" for _ in range(n))


def conversation(rng: random.Random, turns: int, *, system: bool = False, max_words: int = 6) -> list[dict[str, Any]]:
    messages = [{"role": "system", "content": words(rng, 2)}] if system else []
    for _ in range(turns):
        messages.append({"role": "user", "content": words(rng, rng.randint(1, max_words))})
        messages.append({"role": "assistant", "content": words(rng, rng.randint(1, max_words))})
    return messages


def write_chat_jsonl(path: Path, num_rows: int, seed: int = 0, max_words: int = 6) -> Path:
    rng = random.Random(seed)
    with open(path, "w") as f:
        for _ in range(num_rows):
            messages = conversation(rng, rng.randint(1, 3), system=rng.random() < 0.3, max_words=max_words)
            f.write(json.dumps({"messages": messages}) + "\n")
    return path


def write_prompt_completion_jsonl(path: Path, num_rows: int, seed: int = 0) -> Path:
    rng = random.Random(seed)
    with open(path, "w") as f:
        for _ in range(num_rows):
            row = {"prompt": words(rng, rng.randint(1, 8)), "completion": words(rng, rng.randint(1, 5))}
            f.write(json.dumps(row) + "\n")
    return path


def write_half_window_chats(path: Path, rows: int = 400, seed: int = 3) -> Path:
    """bos + <|user|> k words <|end|> + <|assistant|> 12-k words <|end|>: 17 tokens."""
    rng = random.Random(seed)
    with open(path, "w") as f:
        for _ in range(rows):
            k = rng.randint(2, 10)
            user, assistant = words(rng, k), words(rng, 12 - k)
            messages = [{"role": "user", "content": user}, {"role": "assistant", "content": assistant}]
            f.write(json.dumps({"messages": messages}) + "\n")
    return path
