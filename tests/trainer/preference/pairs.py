"""Preference rows over the harness's word tokenizer, built offline for the DPO tests.

The chosen answer continues the prompt's run of consecutive words (the
pattern a tiny model learns quickly); the rejected one jumps at random. Every
pair fills more than half a 32-token sequence and no more than all of it, so
each packed sequence holds exactly one pair and a step's pairs are the same
for any world size (as the harness's aligned text documents are).
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

from tests.trainer.harness import NUM_WORDS

PROMPT_WORDS = 5
ANSWER_WORDS = 6  # with [bos] prompt answer [eos]: 13 tokens a side, 24 of the 32 positions


def preference_rows(num_rows: int, seed: int = 3) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    rows = []
    for _ in range(num_rows):
        start = rng.randrange(NUM_WORDS)
        prompt = [f"w{(start + i) % NUM_WORDS}" for i in range(PROMPT_WORDS)]
        chosen = [f"w{(start + PROMPT_WORDS + i) % NUM_WORDS}" for i in range(ANSWER_WORDS)]
        rejected = [f"w{rng.randrange(NUM_WORDS)}" for _ in range(ANSWER_WORDS)]
        rows.append({"prompt": " ".join(prompt), "chosen": " ".join(chosen), "rejected": " ".join(rejected)})
    return rows


def write_preference_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    with open(path, "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    return path
