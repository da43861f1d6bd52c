"""New GPU XIDs as suspect-node evidence: the operator's query, asked of a real Prometheus.

A stand-in dcgm-exporter (a loopback HTTP server with dcgm-exporter's series
and labels) is scraped by a real Prometheus every second; the operator's query
must name the node whose GPU's XID changed and not the one whose XID is old.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import aiohttp
import pytest
from fsdp_api.ports import free_port
from fsdp_localcluster.prometheus import PrometheusServer
from fsdp_operator.controller.nodes.health import node_health
from fsdp_operator.controller.nodes.xids import XID_SELECTOR_ENV, XID_WINDOW_ENV, new_xids, xid_evidence, xid_query

from tests.support.dcgm import StandInExporter

pytestmark = pytest.mark.slow


@pytest.fixture
def exporter() -> Iterator[StandInExporter]:
    # gpu-a's GPU 0 holds an old 43 (dcgm-exporter up to 4.5.3-4.8.2 labels Hostname); gpu-b's GPU 3 (hostname) 0.
    e = StandInExporter({("gpu-a", 0): 43, ("gpu-b", 3): 0})
    e.labels["gpu-b"] = "hostname"
    yield e
    e.close()


def ask(url: str) -> dict[str, list[str]] | None:
    async def once() -> dict[str, list[str]] | None:
        async with aiohttp.ClientSession() as session:
            return await new_xids(session, url)

    return asyncio.run(once())


def test_a_new_xid_names_its_node_and_a_sticky_old_one_does_not(
    exporter: StandInExporter, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(XID_WINDOW_ENV, "20")  # seconds: a test cannot wait the default 10 minutes
    with PrometheusServer([exporter.target], job="dcgm-exporter") as prom:
        # Three samples of each GPU: the old 43 has been there a while, not just appeared.
        prom.wait_for_series("count_over_time(DCGM_FI_DEV_XID_ERRORS[1m]) >= 3", predicate=lambda rows: len(rows) == 2)
        # gpu-a's 43 is old news (every killed CUDA process leaves one), gpu-b has none.
        assert ask(prom.url) == {}
        exporter.codes["gpu-b", 3] = 79
        prom.wait_for_series('DCGM_FI_DEV_XID_ERRORS{hostname="gpu-b"} == 79')
        deadline = time.monotonic() + 20
        while (found := ask(prom.url)) == {} and time.monotonic() < deadline:
            time.sleep(0.5)
        assert found == {"gpu-b": ["new GPU XID 79 on GPU 3 (dcgm-exporter, last 20 s)"]}
        # Only dcgm-exporter's own targets count: the same series from a job the install did not name is no evidence.
        monkeypatch.setenv(XID_SELECTOR_ENV, 'job="nvidia-dcgm-exporter", namespace="gpu-operator"')
        assert ask(prom.url) == {}
        monkeypatch.setenv(XID_SELECTOR_ENV, 'job="dcgm-exporter"')
        assert ask(prom.url) == found
        # Not label matchers (a PromQL injection, say): no XIDs read, rather than a wrong query.
        monkeypatch.setenv(XID_SELECTOR_ENV, 'job="x"} or vector(79) or up{')
        assert ask(prom.url) is None
    # No Prometheus to ask: no evidence either way, and no claim that there was none.
    assert ask("") is None
    assert ask(f"http://127.0.0.1:{free_port()}") is None


def test_xid_evidence_joins_the_verdict_and_the_healthy_message_says_what_was_asked() -> None:
    rows = [
        {"metric": {"Hostname": "gpu-1", "gpu": "3"}, "value": [0, "79"]},
        {"metric": {"gpu": "1"}, "value": [0, "48"]},
    ]
    evidence = xid_evidence(rows, 600)
    assert evidence == {"gpu-1": ["new GPU XID 79 on GPU 3 (dcgm-exporter, last 10 min)"]}
    pods = [
        {"metadata": {"name": "w-0"}, "spec": {"nodeName": "gpu-1"}},
        {"metadata": {"name": "w-1"}, "spec": {"nodeName": "gpu-2"}},
    ]
    health = node_health(pods, {}, None, evidence)
    assert health is not None and health.message() == (
        "node gpu-1 (pods w-0): new GPU XID 79 on GPU 3 (dcgm-exporter, last 10 min)"
    )
    healthy = node_health(pods, {}, {}, {})
    assert healthy is not None and healthy.message() == (
        "no node condition reports a problem, no GPU reported a new XID and no rank keeps its peers waiting "
        "on the 2 node(s) of the training's pods"
    )
    # The query is the alert's: per node and GPU (either label spelling), a non-zero code that changed.
    query = xid_query(600)
    series = 'DCGM_FI_DEV_XID_ERRORS{job=~"(nvidia-)?dcgm-exporter"}'
    assert f'label_replace({series}, "Hostname", "$1", "hostname", "(.+)")' in query
    assert "[600s:60s]" in query and "> 0) and on (Hostname, gpu) (changes(" in query
