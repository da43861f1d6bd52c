"""YAML read as kubectl reads it, so the CLI and the API server see the same values.

kubectl turns YAML into JSON with go-yaml v2 (through sigs.k8s.io/yaml) and
Go's JSON encoder. Two things differ from PyYAML's YAML 1.1 rules and would
make ``fsdp-operator validate`` disagree with ``kubectl apply`` now that the
API models are strictly typed:

- go-yaml reads ``3e-4`` and ``1e5`` as numbers (its resolver's float
  pattern, transcribed below from go-yaml v2 resolve.go); PyYAML only
  reads them as numbers with a dot (``3.0e-4``) and otherwise as strings.
- Go's JSON encoder writes a whole float as an integer (``2.0`` becomes
  ``2``), so the API server takes ``maxSteps: 2.0`` as the integer 2.

Everything else (booleans such as ``yes``/``on``, nulls, quoting) already
agrees between the two.

Nesting is bounded: libyaml's C parser crashes the process (a segmentation
fault, seen at 50,000 levels), and PyYAML's composer recurses, so the pure
Python loader is used with an explicit depth limit far above any real
FSDPTraining (which nests about 6 levels deep).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import yaml

# go-yaml v2 resolve.go: the float syntax its resolver accepts.
_GO_YAML_FLOAT = re.compile(r"^[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?$")
# Go's encoding/json writes float64 in exponent form from 1e21 up: no longer an integer.
_GO_JSON_INTEGRAL_LIMIT = 1e21
MAX_DEPTH = 100


class KubeLoader(yaml.SafeLoader):
    """SafeLoader with go-yaml's number resolution, Go JSON's whole-float-as-integer, and a depth limit."""

    _depth = 0

    def compose_node(self, parent: yaml.Node | None, index: object) -> yaml.Node | None:
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                mark = self.peek_event().start_mark
                raise yaml.composer.ComposerError(None, None, f"nested deeper than {MAX_DEPTH} levels", mark)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def _construct_number(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> int | float:
    value = loader.construct_yaml_float(node)
    if value.is_integer() and abs(value) < _GO_JSON_INTEGRAL_LIMIT:
        return int(value)
    return value


KubeLoader.add_implicit_resolver("tag:yaml.org,2002:float", _GO_YAML_FLOAT, list("-+0123456789."))
KubeLoader.add_constructor("tag:yaml.org,2002:float", _construct_number)


def load(text: str) -> Any:
    return yaml.load(text, Loader=KubeLoader)


def load_all(text: str) -> Iterator[Any]:
    return yaml.load_all(text, Loader=KubeLoader)
