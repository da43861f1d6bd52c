"""Wildcard binds of native code land on the pod's own address: a tiny LD_PRELOAD library.

In a pod's own network namespace, a server bound to every address (``*:29400``)
takes that port in its pod only. Here all pods share the machine's, so the
first such bind takes the port for every pod. The Python shim
(``network.SITECUSTOMIZE``) covers Python's own sockets, but not native code:
torch's ``TCPStore`` (libuv) binds ``*:<port>`` in C++, so a second
rendezvous host on 29400 (another training's worker 0, or one still shutting
down) found the port taken, and torch elastic then silently used the first
one's store as a client: the two trainings shared a store until the first
went away and took it with it (issue 23, the stall restart that never
rendezvoused). Preloaded into every process the agent starts (not into
containers of image mode), ``bind`` rewrites an unspecified IPv4 or IPv6
address to the pod's (``POD_IP_ENV``; IPv4-mapped for IPv6 sockets).

Built once per agent with the system C compiler; without one the agent goes on
without it and says so.
"""

from __future__ import annotations

import hashlib
import logging
import shutil
import subprocess
from pathlib import Path

from .network import POD_IP_ENV

log = logging.getLogger(__name__)

SOURCE = r"""
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dlfcn.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

typedef int (*bind_fn)(int, const struct sockaddr *, socklen_t);

int bind(int fd, const struct sockaddr *addr, socklen_t len) {
    static bind_fn real_bind;
    if (!real_bind) real_bind = (bind_fn)dlsym(RTLD_NEXT, "bind");
    const char *ip = getenv("@POD_IP_ENV@");
    if (ip && addr && addr->sa_family == AF_INET && len >= sizeof(struct sockaddr_in)) {
        struct sockaddr_in a;
        memcpy(&a, addr, sizeof a);
        if (a.sin_addr.s_addr == htonl(INADDR_ANY) && inet_pton(AF_INET, ip, &a.sin_addr) == 1)
            return real_bind(fd, (const struct sockaddr *)&a, sizeof a);
    }
    if (ip && addr && addr->sa_family == AF_INET6 && len >= sizeof(struct sockaddr_in6)) {
        struct sockaddr_in6 a;
        char mapped[INET6_ADDRSTRLEN + 8];
        memcpy(&a, addr, sizeof a);
        snprintf(mapped, sizeof mapped, "::ffff:%s", ip);
        if (IN6_IS_ADDR_UNSPECIFIED(&a.sin6_addr) && inet_pton(AF_INET6, mapped, &a.sin6_addr) == 1)
            return real_bind(fd, (const struct sockaddr *)&a, sizeof a);
    }
    return real_bind(fd, addr, len);
}
""".replace("@POD_IP_ENV@", POD_IP_ENV)


def build(directory: Path) -> Path | None:
    """The compiled library in ``directory`` (reused while the source is unchanged), or None without a compiler."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        log.warning("no C compiler: native wildcard binds are not moved to the pod's address (pods share ports)")
        return None
    digest = hashlib.sha256(SOURCE.encode()).hexdigest()[:12]
    library = directory / f"podbind-{digest}.so"
    if library.is_file():
        return library
    directory.mkdir(parents=True, exist_ok=True)
    source = directory / f"podbind-{digest}.c"
    source.write_text(SOURCE)
    partial = library.with_suffix(".so.tmp")
    result = subprocess.run(
        [compiler, "-shared", "-fPIC", "-O2", "-o", str(partial), str(source), "-ldl"],
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        log.warning("could not build the bind shim (%s): %s", compiler, result.stderr.strip()[-500:])
        return None
    partial.replace(library)
    return library
