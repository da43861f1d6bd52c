"""Where the test suite's time goes: seconds per package and per end-to-end module, from pytest's JUnit XML.

`make test` writes runs/junit.xml; this prints the Markdown tables that
docs/e2e.md keeps ("Where the suite's time goes"), then the slowest tests.

    python tools/test_times.py [runs/junit.xml] [--slowest 10]

A test's time is its setup, call and teardown, so a module's share of a
session fixture (the test cluster, the whole cluster) counts where it starts.
"""

from __future__ import annotations

import argparse
import xml.etree.ElementTree as ET
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

DEFAULT = Path(__file__).resolve().parents[1] / "runs" / "junit.xml"


@dataclass(frozen=True)
class Case:
    path: str  # tests/e2e/test_faults.py
    name: str
    seconds: float
    outcome: str  # passed, failed, error, skipped


def read_cases(xml: Path) -> list[Case]:
    cases = []
    for tc in ET.parse(xml).getroot().iter("testcase"):
        # classname is the dotted module path (tests.e2e.test_faults), or with a class after it.
        parts = tc.get("classname", "").split(".")
        while parts and not parts[-1].startswith("test_"):
            parts.pop()
        path = "/".join(parts) + ".py" if parts else tc.get("file", "?")
        outcome = "passed"
        for child, name in (("failure", "failed"), ("error", "error"), ("skipped", "skipped")):
            if tc.find(child) is not None:
                outcome = name
        cases.append(Case(path, tc.get("name", "?"), float(tc.get("time", 0)), outcome))
    return cases


def group_of(path: str) -> str:
    """A package (tests/operator, localcluster/tests, ...), or the module itself for the e2e and image tests."""
    parts = path.split("/")
    if parts[:2] in (["tests", "e2e"], ["tests", "images"]):
        return path
    return "/".join(parts[:2]) if len(parts) > 2 else path


def table(cases: list[Case]) -> str:
    seconds: dict[str, float] = defaultdict(float)
    counts: dict[str, int] = defaultdict(int)
    for c in cases:
        seconds[group_of(c.path)] += c.seconds
        counts[group_of(c.path)] += 1
    total = sum(seconds.values())
    rows = ["| tests | count | minutes | share |", "| --- | ---: | ---: | ---: |"]
    for group, s in sorted(seconds.items(), key=lambda kv: -kv[1]):
        rows.append(f"| `{group}` | {counts[group]} | {s / 60:.1f} | {s / total:.0%} |")
    rows.append(f"| all | {len(cases)} | {total / 60:.1f} | 100% |")
    return "\n".join(rows)


def slowest(cases: list[Case], n: int) -> str:
    rows = ["| test | seconds |", "| --- | ---: |"]
    for c in sorted(cases, key=lambda c: -c.seconds)[:n]:
        rows.append(f"| `{c.path}::{c.name}` | {c.seconds:.0f} |")
    return "\n".join(rows)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("xml", nargs="?", type=Path, default=DEFAULT)
    p.add_argument("--slowest", type=int, default=10)
    args = p.parse_args()
    if not args.xml.exists():
        raise SystemExit(f"{args.xml}: no such file (make test writes it; or pytest --junitxml=FILE)")
    cases = read_cases(args.xml)
    outcomes = defaultdict(int)
    for c in cases:
        outcomes[c.outcome] += 1
    print(", ".join(f"{n} {k}" for k, n in sorted(outcomes.items())))
    print()
    print(table(cases))
    print()
    print(slowest(cases, args.slowest))


if __name__ == "__main__":
    main()
