"""New GPU XIDs as suspect-node evidence, asked of the Prometheus that scrapes dcgm-exporter.

``DCGM_FI_DEV_XID_ERRORS`` holds a GPU's last XID and never resets
(NVIDIA/dcgm-exporter#500, NVIDIA/DCGM#277): every killed CUDA process leaves
a 43 or 45 behind, so a value is no news; a change is. The node check asks
``FSDP_OPERATOR_PROMETHEUS_URL`` once per check for the GPUs whose value
changed to a non-zero code within the last ``FSDP_OPERATOR_XID_WINDOW_SECONDS``
(600), taken per node and GPU as the ``FSDPGPUXidError`` alert does, so that
neither a new pod on the GPU, nor an exporter restart, nor an exporter that
puts the code in a label looks like a new fault. dcgm-exporter's node label is
the node's name (its ``NODE_NAME``): ``Hostname``, or ``hostname`` after its
4.5.3-4.8.2 release (NVIDIA/dcgm-exporter#655); both are read. Unset URL, no
XID evidence (docs/operator.md, "Bad nodes").
"""

from __future__ import annotations

import logging
import math
import os
import re
from collections.abc import Mapping
from typing import Any

import aiohttp
from fsdp_api.contract import DCGM_XID_ERRORS

from ..kube import NETWORK_ERRORS
from ..settings import env_int

log = logging.getLogger(__name__)

PROMETHEUS_URL_ENV = "FSDP_OPERATOR_PROMETHEUS_URL"
XID_WINDOW_ENV = "FSDP_OPERATOR_XID_WINDOW_SECONDS"
DEFAULT_WINDOW_SECONDS = 600
QUERY_TIMEOUT_SECONDS = 5.0
XID_SERIES = DCGM_XID_ERRORS
NODE_LABEL = "Hostname"
# Which scrape targets' series count: dcgm-exporter's own, never a series of that name that some
# other target exports (a tenant's pod naming a victim node in its Hostname label). PromQL label
# matchers; the default matches the job of the GPU operator's (nvidia-dcgm-exporter) and of the
# dcgm-exporter chart's (dcgm-exporter) monitors; an install pins its namespace too
# (docs/operator.md, "Bad nodes").
XID_SELECTOR_ENV = "FSDP_OPERATOR_XID_SELECTOR"
DEFAULT_XID_SELECTOR = 'job=~"(nvidia-)?dcgm-exporter"'
_MATCHER = r'\s*[a-zA-Z_][a-zA-Z0-9_]*\s*(=|!=|=~|!~)\s*"(\\.|[^"\\])*"\s*'
SELECTOR_FORM = re.compile(rf"^{_MATCHER}(,{_MATCHER})*$")


def window_seconds() -> int:
    return env_int(XID_WINDOW_ENV, DEFAULT_WINDOW_SECONDS, minimum=10)


def xid_selector() -> str | None:
    """The install's label matchers for dcgm-exporter's series; None (and a log line) when not PromQL matchers."""
    selector = os.environ.get(XID_SELECTOR_ENV, DEFAULT_XID_SELECTOR)
    if not SELECTOR_FORM.match(selector):
        log.error(
            '%s=%r is not PromQL label matchers (e.g. job="nvidia-dcgm-exporter",namespace="gpu-operator"): '
            "no XIDs are read",
            XID_SELECTOR_ENV,
            selector,
        )
        return None
    return selector.strip()


def xid_query(window: int, selector: str = DEFAULT_XID_SELECTOR) -> str:
    """The GPUs (per node) whose last XID is non-zero and changed within ``window`` seconds (ten samples of it)."""
    series = f"{XID_SERIES}{{{selector}}}"
    per_gpu = f'max by ({NODE_LABEL}, gpu) (label_replace({series}, "{NODE_LABEL}", "$1", "hostname", "(.+)"))'
    step = max(1, window // 10)
    return f"({per_gpu} > 0) and on ({NODE_LABEL}, gpu) (changes(({per_gpu})[{window}s:{step}s]) > 0)"


def xid_evidence(result: list[Mapping[str, Any]], window: int) -> dict[str, list[str]]:
    """Per node, a line for each GPU with a new XID, from the query's ``data.result``."""
    out: dict[str, list[str]] = {}
    for row in result:
        labels, value = row.get("metric") or {}, (row.get("value") or [None, "nan"])[1]
        try:
            code = float(value)
        except (TypeError, ValueError):
            continue
        node = labels.get(NODE_LABEL)
        if not node or not math.isfinite(code):
            continue
        out.setdefault(node, []).append(
            f"new GPU XID {code:g} on GPU {labels.get('gpu', '?')} (dcgm-exporter, last {window // 60 or window}"
            f"{' min' if window >= 60 else ' s'})"
        )
    return {node: sorted(lines) for node, lines in out.items()}


async def new_xids(session: aiohttp.ClientSession, url: str | None = None) -> dict[str, list[str]] | None:
    """The nodes with a new XID and their lines; None when there is no Prometheus to ask, or it did not answer."""
    base = url if url is not None else os.environ.get(PROMETHEUS_URL_ENV, "")
    if not base:
        return None
    window, selector = window_seconds(), xid_selector()
    if selector is None:
        return None
    try:
        async with session.get(
            f"{base.rstrip('/')}/api/v1/query",
            params={"query": xid_query(window, selector)},
            timeout=aiohttp.ClientTimeout(total=QUERY_TIMEOUT_SECONDS),
            allow_redirects=False,
        ) as rsp:
            if rsp.status != 200:
                log.warning("the XID query to %s answered HTTP %s", base, rsp.status)
                return None
            doc = await rsp.json(content_type=None)
    except (TimeoutError, ValueError, *NETWORK_ERRORS) as e:
        log.warning("the XID query to %s failed: %s", base, type(e).__name__)
        return None
    if doc.get("status") != "success":
        log.warning("the XID query to %s failed: %s", base, doc.get("error"))
        return None
    return xid_evidence((doc.get("data") or {}).get("result") or [], window)
