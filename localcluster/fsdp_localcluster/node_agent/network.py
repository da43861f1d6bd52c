"""The pod network of the node agent, on loopback: pod IPs, cluster DNS, and the Python shim.

Each pod gets its own 127/8 address. Service names resolve to the address of
the pod the Service selects, and ``<hostname>.<subdomain>`` names (a headless
Service's pods) to that pod's: the agent writes them into command lines and
environments (``PodNetwork.rewrite``), and an ``nslookup`` shim answers from
the same table. ``SITECUSTOMIZE`` gives Python processes the rest of a pod's
network identity (wildcard binds, their own name, "is this address mine").
"""

from __future__ import annotations

import random
import re
import threading
from collections.abc import Sequence
from pathlib import Path

from .client import Obj

POD_IP_ENV = "NODE_AGENT_POD_IP"


class PodNetwork:
    """Pod IPs on loopback and the cluster-DNS table (Service names -> pod IPs).

    Each agent draws its own 127.N.0.0/16 so that two agents on one machine do
    not hand out the same addresses. IPs are stable per pod *name*: a pod that
    a controller deletes and recreates under the same name keeps its address,
    so peers holding the old address (in their environment) still reach it.
    """

    def __init__(self, hosts_file: Path) -> None:
        self.prefix = f"127.{random.randint(2, 254)}"
        self.hosts_file = hosts_file
        self._ips: dict[tuple[str, str], str] = {}
        self._lock = threading.Lock()
        self.table: dict[str, str] = {}
        # Every Service with a selector, by namespace, whether or not a live pod backs it now.
        self.services: dict[str, set[str]] = {}
        # (namespace, name) records that cluster DNS does not serve (yet): see ``withhold``.
        self.withheld: set[tuple[str, str]] = set()
        # Services backed by a process the harness runs on the host, not by a pod: see ``serve_from_host``.
        self.host_services: dict[tuple[str, str], str] = {}

    def serve_from_host(self, namespace: str, name: str, ip: str = "127.0.0.1") -> None:
        """Resolve Service ``name`` to ``ip``: a controller the harness runs on loopback (its webhook or status
        server), whose Service has no pod behind it here."""
        with self._lock:
            self.host_services[(namespace, name)] = ip

    def withhold(self, namespace: str, name: str, withheld: bool = True) -> None:
        """Serve no record for ``name`` (a pod's ``<hostname>.<subdomain>``) until called with False.

        What a pod sees while cluster DNS has not published its record yet
        (the endpoints of a headless Service lag the pod, e.g. after a JobSet restart).
        """
        with self._lock:
            (self.withheld.add if withheld else self.withheld.discard)((namespace, name))

    def is_withheld(self, namespace: str, name: str) -> bool:
        """Whether ``name`` is withheld: a process starts without it rather than wait for it."""
        with self._lock:
            return (namespace, name) in self.withheld

    def ip_for(self, namespace: str, name: str) -> str:
        with self._lock:
            key = (namespace, name)
            if key not in self._ips:
                n = len(self._ips) + 1
                self._ips[key] = f"{self.prefix}.{n // 250}.{n % 250 + 1}"
            return self._ips[key]

    def refresh(self, services: Sequence[Obj], pods: Sequence[Obj]) -> None:
        """Rebuild the DNS table from the Services and the live pods they select.

        Each Service name resolves to the first live pod it selects. A headless
        Service also gives each pod it selects that sets ``spec.hostname`` and
        names the Service as its ``spec.subdomain`` a name of its own,
        ``<hostname>.<subdomain>[.<ns>.svc[.cluster.local]]``: the records
        cluster DNS serves from the Service's endpoints (hostname-addressed
        pods: JobSet's, Indexed Jobs' with a subdomain).
        """
        table: dict[str, str] = {}
        known: dict[str, set[str]] = {}
        for svc in services:
            meta, spec = svc["metadata"], svc.get("spec") or {}
            selector = spec.get("selector") or {}
            if not selector:
                continue
            ns = meta["namespace"]
            known.setdefault(ns, set()).add(meta["name"])
            live = sorted(
                (
                    p
                    for p in pods
                    if p["metadata"]["namespace"] == ns
                    and not p["metadata"].get("deletionTimestamp")
                    and (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
                    and all((p["metadata"].get("labels") or {}).get(k) == v for k, v in selector.items())
                ),
                key=lambda p: str(p["metadata"]["name"]),
            )
            if not live:
                continue
            name = meta["name"]
            self._add(table, ns, name, self.ip_for(ns, live[0]["metadata"]["name"]))
            if spec.get("clusterIP") != "None":
                continue
            for p in live:
                pod_spec = p.get("spec") or {}
                hostname, subdomain = pod_spec.get("hostname"), pod_spec.get("subdomain")
                # Of two live pods with one hostname (a replacement), the first by name, like a Service's.
                if (ns, f"{hostname}.{name}") in self.withheld:
                    continue
                if hostname and subdomain == name and f"{ns}/{hostname}.{name}" not in table:
                    self._add(table, ns, f"{hostname}.{name}", self.ip_for(ns, p["metadata"]["name"]))
        with self._lock:
            for (ns, name), ip in self.host_services.items():
                self._add(table, ns, name, ip)
            self.table = table
            self.services = known
        lines = [f"{ip} {name}" for name, ip in sorted(table.items()) if "/" not in name]
        with self._lock:  # several threads refresh; the hosts file is replaced whole
            tmp = self.hosts_file.with_suffix(".tmp")
            tmp.write_text("\n".join(lines) + "\n")
            tmp.replace(self.hosts_file)

    @staticmethod
    def _add(table: dict[str, str], ns: str, name: str, ip: str) -> None:
        """``name`` as cluster DNS serves it: qualified by namespace, and namespace-local (resolved per pod)."""
        for alias in (f"{name}.{ns}.svc.cluster.local", f"{name}.{ns}.svc", f"{name}.{ns}"):
            table[alias] = ip
        table.setdefault(f"{ns}/{name}", ip)

    def service_names(self, namespace: str) -> list[str]:
        """The Services of ``namespace`` that select pods, resolvable now or not (no live pod behind them yet)."""
        with self._lock:
            return sorted(self.services.get(namespace, ()))

    def names_for(self, namespace: str) -> dict[str, str]:
        """Resolvable names as seen from ``namespace``: short names plus qualified ones, longest first."""
        with self._lock:
            table = dict(self.table)
        names = {k.split("/", 1)[1]: v for k, v in table.items() if k.startswith(f"{namespace}/")}
        names |= {k: v for k, v in table.items() if "/" not in k}
        return dict(sorted(names.items(), key=lambda kv: -len(kv[0])))

    def rewrite(self, text: str, namespace: str) -> str:
        """Replace resolvable host names in ``text`` by their IPs (what DNS would have answered)."""
        for name, ip in self.names_for(namespace).items():
            if name in text:
                # A whole host name: after "//" (a URL) or not inside another name or path.
                text = re.sub(rf"(?:(?<=//)|(?<![\w./-])){re.escape(name)}(?![\w-])", ip, text)
        return text


# The pod network for Python processes (imported at start-up via PYTHONPATH).
SITECUSTOMIZE = '''\
"""Installed by the node agent (fsdp_localcluster/node_agent/network.py) for its pods' processes.

What the pod's own network namespace would give a Python process, emulated on loopback.
"""
import os
import socket
import sys

_POD_IP = os.environ.get("@POD_IP_ENV@")
if _POD_IP:
    # A wildcard bind is a bind to the pod's address, so two pods can serve one port.
    _bind = socket.socket.bind

    def _pod_bind(self, address):
        if self.family == socket.AF_INET and isinstance(address, tuple) and address[0] in ("", "0.0.0.0"):
            address = (_POD_IP, *address[1:])
        return _bind(self, address)

    socket.socket.bind = _pod_bind

    # The pod's own name stands for its address: what it tells peers to dial.
    _getfqdn = socket.getfqdn

    def _pod_getfqdn(name=""):
        return _POD_IP if name in ("", socket.gethostname()) else _getfqdn(name)

    socket.getfqdn = _pod_getfqdn

    # torch elastic hosts the rendezvous store when the endpoint "is this machine",
    # and every 127/8 address would qualify; in its own namespace only the pod's
    # address (or localhost) is the pod.
    def _is_this_pod(host):
        return host in ("localhost", "127.0.0.1", _POD_IP)

    class _PatchRendezvousBackend:
        target = "torch.distributed.elastic.rendezvous.c10d_rendezvous_backend"

        def find_spec(self, name, path=None, target=None):
            if name != self.target:
                return None
            from importlib.machinery import PathFinder

            spec = PathFinder.find_spec(name, path)
            if spec is None or spec.loader is None:
                return spec
            exec_module = spec.loader.exec_module

            def exec_and_patch(module):
                exec_module(module)
                module._matches_machine_hostname = _is_this_pod

            spec.loader.exec_module = exec_and_patch
            return spec

    sys.meta_path.insert(0, _PatchRendezvousBackend())
'''.replace("@POD_IP_ENV@", POD_IP_ENV)

# ``nslookup NAME``: succeeds when the agent's DNS table resolves NAME.
NSLOOKUP = """\
#!/bin/sh
# nslookup for pods of the node agent: answers from its DNS table.
name="$1"
# Names in the command line were already replaced by addresses (see PodNetwork.rewrite).
case "$name" in *[!0-9.]*) ;; *) echo "Name: $name"; echo "Address: $name"; exit 0 ;; esac
line=$(grep -E "[[:space:]]${name}(\\.[a-z0-9.-]*)?$" "{hosts}" | head -n 1)
[ -n "$line" ] || { echo "** server can't find $name: NXDOMAIN"; exit 1; }
echo "Name: $name"; echo "Address: ${line%% *}"
"""
