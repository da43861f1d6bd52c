"""``python -m fsdp_operator.controller``: run the operator without the CLI's other commands.

Tests and the benchmark start the operator this way, so they depend only on
run_operator's contract; ``fsdp-operator run`` is the user-facing command.
"""

from __future__ import annotations

import argparse

from .main import run_operator
from .settings import DEFAULT_PEERING_NAME


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m fsdp_operator.controller", description=__doc__)
    scope = p.add_mutually_exclusive_group(required=True)
    scope.add_argument("--namespace", "-n", help="serve only this namespace")
    scope.add_argument("--all-namespaces", "-A", action="store_true", help="serve every namespace")
    p.add_argument(
        "--liveness", dest="liveness_endpoint", help="kopf liveness endpoint, e.g. http://0.0.0.0:8080/healthz"
    )
    p.add_argument("--metrics-port", type=int, help="port of the operator's /metrics")
    p.add_argument("--peering", dest="peering_name", default=DEFAULT_PEERING_NAME, help="kopf peering object name")
    p.add_argument("--standalone", action="store_true", help="no peering: do not pause for other instances")
    p.add_argument("--priority", type=int, help="peering priority (default $FSDP_OPERATOR_PRIORITY or 0)")
    p.add_argument("--scrape-interval", type=float, help="seconds between trainer metric reads; 0 disables")
    p.add_argument("--verbose", action="store_true")
    a = p.parse_args(argv)
    run_operator(
        namespaces=[a.namespace] if a.namespace else None,
        all_namespaces=a.all_namespaces,
        liveness_endpoint=a.liveness_endpoint,
        metrics_port=a.metrics_port,
        peering_name=a.peering_name,
        standalone=a.standalone,
        priority=a.priority,
        scrape_interval=a.scrape_interval,
        verbose=a.verbose,
    )


if __name__ == "__main__":
    main()
