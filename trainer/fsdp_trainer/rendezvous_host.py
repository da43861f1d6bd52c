"""Node 0 hosts the c10d rendezvous at its own address, without looking up its rendezvous name.

torchrun decides whether its agent hosts the rendezvous store by resolving the
endpoint's host and comparing the answer with its own addresses, then connects
to the store by that name too. A TrainJob's node 0 is reached as
``<hostname>.<subdomain>``, which only cluster DNS resolves (its /etc/hosts holds
the fully qualified name): while the record is missing (the headless Service's
endpoints lag a restarted JobSet), node 0 takes itself for a client and waits
out the read timeout for a store that nobody hosts. So node 0 rewrites its own
torchrun command: the endpoint becomes its pod address (the downward API's
status.podIP, ENV_POD_IP) and ``is_host=true`` says that it hosts. The other
nodes keep the name, which they need DNS for in any case.
"""

from __future__ import annotations

from collections.abc import Mapping

from fsdp_api.contract import ENV_POD_IP

from .errors import ConfigError

ENDPOINT_FLAGS = ("--rdzv-endpoint", "--rdzv_endpoint")
CONF_FLAGS = ("--rdzv-conf", "--rdzv_conf")


def _locate(args: list[str], flags: tuple[str, ...]) -> tuple[int, str, str] | None:
    """The argument holding the value of one of ``flags`` (``--flag=value`` or ``--flag value``):
    its index, what precedes the value in it, and the value."""
    for i, arg in enumerate(args):
        name, eq, value = arg.partition("=")
        if name in flags:
            if eq:
                return i, f"{name}=", value
            if i + 1 < len(args):
                return i + 1, "", args[i + 1]
    return None


def _with_value(args: list[str], flags: tuple[str, ...], value: str) -> list[str]:
    found = _locate(args, flags)
    if found is None:
        # torchrun's own options come before the program and its arguments.
        return [f"{flags[0]}={value}", *args]
    i, prefix, _ = found
    return [*args[:i], prefix + value, *args[i + 1 :]]


def hosted_here(torchrun_args: list[str], condition: str, env: Mapping[str, str]) -> tuple[list[str], str | None]:
    """torchrun's arguments as this pod runs them, and the line that says so (None: unchanged).

    ``condition`` is ``VAR=VALUE``; only where ``env`` has that value does this
    pod host the rendezvous.
    """
    var, eq, wanted = condition.partition("=")
    if not var or not eq:
        raise ConfigError([f"--host-rendezvous-if: {condition!r} is not VAR=VALUE"])
    if env.get(var) != wanted:
        return torchrun_args, None
    endpoint = _locate(torchrun_args, ENDPOINT_FLAGS)
    if endpoint is None:
        return torchrun_args, None
    host, _, port = endpoint[2].rpartition(":")
    address = env.get(ENV_POD_IP, "")
    if not address or not host or not port.isdigit():
        return torchrun_args, (
            f"{var}={wanted}, but {ENV_POD_IP} is not set: torchrun looks up {endpoint[2]} to decide whether "
            "this pod hosts the rendezvous"
        )
    here = f"[{address}]:{port}" if ":" in address else f"{address}:{port}"
    args = _with_value(torchrun_args, ENDPOINT_FLAGS, here)
    conf = _locate(args, CONF_FLAGS)
    options = [o for o in (conf[2].split(",") if conf else []) if o and not o.startswith("is_host=")]
    args = _with_value(args, CONF_FLAGS, ",".join([*options, "is_host=true"]))
    return args, (
        f"node {wanted} ({var}={wanted}) hosts the rendezvous at its own address {here}; "
        f"the other nodes reach it as {host}:{port}"
    )
