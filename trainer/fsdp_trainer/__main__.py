"""``python -m fsdp_trainer`` / ``fsdp-train``: train, or export a checkpoint.

    fsdp-train --config train.yaml [--training.max-steps 20 --fsdp.sharding-strategy full ...]
    fsdp-train export --checkpoint /checkpoints/step-00001000 --output ./hf-model
    fsdp-train generate --checkpoint /checkpoints --prompt "What is FSDP?"
    fsdp-train eval --checkpoint /checkpoints --data heldout.jsonl
    fsdp-train check --config train.yaml --nnodes 2 --nproc-per-node 8 [-- torchrun ...]

Overrides use the YAML field names in kebab case (``--section.field-name
value``). Configuration errors print one ``field: message`` line each and exit
with status 2, on every rank, before any process group is created; ``check``
does the same once, before torchrun starts (the pods' command, see check.py).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from fsdp_api.contract import CHECK_COMMAND, CONFIG_ERROR_EXIT_CODE, STOPPED_EXIT_CODE

from .errors import CheckpointSaveError, ConfigError, UnloadableCheckpointError, UnsafeCheckpointError

# The other commands, which --help of the training command would otherwise hide.
SUBCOMMANDS = f"""other commands:
  fsdp-train export --checkpoint DIR --output DIR   a checkpoint as a Hugging Face model directory (export --help)
  fsdp-train generate --model DIR|--checkpoint DIR --prompt TEXT
                                                   a few samples from a trained model (generate --help)
  fsdp-train eval --model DIR|--checkpoint DIR --data FILE
                                                   loss and perplexity on a data file (eval --help)
  fsdp-train {CHECK_COMMAND} --config FILE --nnodes N --nproc-per-node P [-- torchrun ...]
                                                   the pods' config check, then the launch (check --help)"""


def setup_logging() -> None:
    rank = int(os.environ.get("RANK", "0") or 0)
    logging.basicConfig(
        level=logging.INFO if rank == 0 else logging.WARNING,
        format=f"%(asctime)s rank{rank} %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )


def train_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="fsdp-train",
        description="FSDP2 trainer for Hugging Face causal LMs. "
        "Unknown --section.field-name VALUE arguments override train.yaml.",
        epilog=SUBCOMMANDS,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--config", required=True, help="train.yaml (the job's ConfigMap)")
    parser.add_argument("--trace-dir", type=Path, help="write a JSON-lines record of the run here (tests, debugging)")
    args, overrides = parser.parse_known_args(argv)
    from .config import load_config

    cfg = load_config(args.config, overrides)
    from .train import Stopped, run

    try:
        run(cfg, trace_dir=args.trace_dir)
    except Stopped as e:
        logging.getLogger("fsdp_trainer").warning("%s", e)
        from .supervisor import record_stop

        # torchrun drops this exit code; the supervising check reads the record instead.
        record_stop(e.step)
        return STOPPED_EXIT_CODE  # terminated, not finished: the job must not count as succeeded
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    setup_logging()
    try:
        if argv[:1] == ["export"]:
            from .export import main as export_main

            return export_main(argv[1:])
        if argv[:1] == ["generate"]:
            from .generate import main as generate_main

            return generate_main(argv[1:])
        if argv[:1] == ["eval"]:
            from .eval_command import main as eval_main

            return eval_main(argv[1:])
        if argv[:1] == [CHECK_COMMAND]:
            from .check import check_main

            return check_main(argv[1:])
        return train_main(argv)
    except ConfigError as e:
        say(f"fsdp-train: {e}")
        return CONFIG_ERROR_EXIT_CODE
    except (UnsafeCheckpointError, UnloadableCheckpointError, CheckpointSaveError) as e:
        say(f"fsdp-train: {e}")
        return 1


def say(text: str) -> None:
    """``text`` and its newline to stderr in one write.

    Every rank of a launch reports the same error to the same pipe. print()
    writes the text and the newline separately, and unbuffered (the pods set
    PYTHONUNBUFFERED) another rank's line can land between the two: two lines
    run together. One write under PIPE_BUF bytes is never split.
    """
    sys.stderr.write(text + "\n")
    sys.stderr.flush()


if __name__ == "__main__":
    sys.exit(main())
