"""The trainer config a checkpoint was written with (``CONFIG_FILE``), read across trainer versions.

A checkpoint outlives the image that wrote it: a newer trainer's config may
carry fields this one does not know. Export needs the whole config (the model
and LoRA it rebuilds) and says which field it does not know, with the likely
reason, in one line per field, rather than pydantic's count of errors. The
ownership checks need only ``job`` (whose checkpoints these are), which they
read alone, so a newer field elsewhere does not hide a conflict.
"""

from __future__ import annotations

from pathlib import Path

from fsdp_api import kubeyaml
from fsdp_api.rules import format_errors
from fsdp_api.trainer_config import JobInfo, TrainerConfig
from pydantic import ValidationError

from ..errors import ConfigError
from .layout import CONFIG_FILE

NEWER = "; a newer trainer version wrote this checkpoint: read it with that version's image or a later one"


def parse_saved_config(text: str, where: str) -> TrainerConfig:
    """``text`` as a TrainerConfig; ConfigError with one ``<where>: <field>: ...`` line per problem."""
    try:
        return TrainerConfig.from_yaml(text)
    except ValidationError as e:
        newer = any(err["type"] == "extra_forbidden" for err in e.errors())
        raise ConfigError(
            [f"{where}: {line}{NEWER if newer else ''}" for line in format_errors(e, model=TrainerConfig)]
        ) from None
    except ValueError as e:  # not YAML, or not a mapping
        raise ConfigError([f"{where}: not a trainer config ({e})"]) from None


def read_saved_config(checkpoint: Path) -> TrainerConfig:
    file = checkpoint / CONFIG_FILE
    try:
        text = file.read_text()
    except OSError as e:
        raise ConfigError([f"{file}: cannot read the checkpoint's config: {e.strerror}"]) from None
    return parse_saved_config(text, str(file))


def parse_saved_job(text: str) -> JobInfo | None:
    """The ``job`` section alone (None: absent or unreadable, which claims nothing either way)."""
    try:
        data = kubeyaml.load(text)
        return JobInfo.model_validate(data["job"]) if isinstance(data, dict) and "job" in data else None
    except (ValueError, ValidationError, KeyError, TypeError):
        return None
