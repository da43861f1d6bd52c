"""A real Prometheus scrapes a real 2-rank trainer run; PromQL sees what dashboards will."""

from __future__ import annotations

import math
import time
from pathlib import Path

import pytest
from fsdp_localcluster.prometheus import PrometheusServer, value

from tests.support.trainer_run import TrainerRun

pytestmark = pytest.mark.slow

JOB = "scrape-test"
SEL = f'{{job_name="{JOB}"}}'


def test_prometheus_scrapes_the_trainer(tmp_path: Path) -> None:
    run = TrainerRun(tmp_path / "run", name=JOB, max_steps=80)
    with PrometheusServer([run.target], job="fsdp-trainer") as prom, run:
        started = time.time()
        # Both ranks' steps arrive through the one endpoint, well before the end.
        rows = prom.wait_for_series(
            f"fsdp_train_step{SEL} >= 10", timeout=300, predicate=lambda r: len(r) == 2 and run.running()
        )
        assert {r["metric"]["local_rank"] for r in rows} == {"0", "1"}
        # Prometheus's own job/instance labels sit beside job_name without clashing.
        assert {r["metric"]["job"] for r in rows} == {"fsdp-trainer"}
        assert {r["metric"]["instance"] for r in rows} == {run.target}
        assert {r["metric"]["node_rank"] for r in rows} == {"0"}
        assert [value(r) for r in prom.query('up{job="fsdp-trainer"}')] == [1.0]

        rate = prom.wait_for_series(f"sum by (job_name) (rate(fsdp_train_tokens_total{SEL}[5s])) > 0", timeout=30)
        assert value(rate[0]) > 0
        loss = prom.query(f"max by (job_name) (fsdp_train_loss{SEL})")
        assert math.isfinite(value(loss[0])) and value(loss[0]) > 0
        p50 = prom.wait_for_series(
            f"histogram_quantile(0.5, sum by (job_name, le) (rate(fsdp_train_step_duration_seconds_bucket{SEL}[10s])))",
            timeout=30,
            predicate=lambda r: math.isfinite(value(r[0])),
        )
        assert 0 < value(p50[0]) < 60
        info = prom.query(f"fsdp_trainer_info{SEL}")
        assert {(r["metric"]["model"], r["metric"]["world_size"]) for r in info} == {("tiny", "2")}

        assert run.wait(timeout=600) == 0, run.output()
        ended = time.time()
        # Over the whole run the step only ever grew, and reached the end.
        series = prom.query_range(f"max by (job_name) (fsdp_train_step{SEL})", started, ended, step="1s")
        steps = [float(v) for _, v in series[0]["values"]]
        assert steps == sorted(steps)
        assert steps[-1] >= 60 and steps[-1] > steps[0]
        tokens = prom.query_range(f"fsdp_train_tokens_total{SEL}", started, ended, step="1s")
        assert {s["metric"]["local_rank"] for s in tokens} == {"0", "1"}
        for s in tokens:
            counts = [float(v) for _, v in s["values"]]
            assert counts == sorted(counts) and counts[-1] > counts[0]
