"""One request to a tracking server from the pod's check, and what its failures mean.

A name that does not resolve stays wrong however long the training waits: an
error. A server that does not answer now, or answers that it cannot now (HTTP
5xx, 429), may be back before the first point (which is dropped, not waited
for, until then): a warning.
"""

from __future__ import annotations

import socket
import ssl
import urllib.error
import urllib.request
from dataclasses import dataclass

TIMEOUT_SECONDS = 5.0


@dataclass
class Answer:
    status: int
    body: bytes


class NoAnswer(Exception):
    """No HTTP answer at all; ``error`` says whether that stays wrong (else it is a warning)."""

    def __init__(self, text: str, *, error: bool) -> None:
        super().__init__(text)
        self.error = error

    def problems(self) -> tuple[list[str], list[str]]:
        return ([str(self)], []) if self.error else ([], [str(self)])


def not_now(answer: Answer, where: str) -> str | None:
    """The warning for an answer that says the server cannot serve now (HTTP 5xx, 429); None for any other.

    Those say "not now" rather than "wrong address" or "wrong credentials".
    """
    if answer.status != 429 and answer.status < 500:
        return None
    return (
        f"{where} answered HTTP {answer.status} now: training starts, and its points are dropped "
        "(fsdp_tracker_points_dropped_total) until the server answers"
    )


def ask(url: str, where: str, *, headers: dict[str, str], data: bytes | None = None, insecure: bool = False) -> Answer:
    """The server's answer to one request (any HTTP status), or NoAnswer naming ``where``."""
    request = urllib.request.Request(url, data=data, headers=headers)
    context = ssl.create_default_context()
    if insecure:
        context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_SECONDS, context=context) as answer:
            return Answer(answer.status, answer.read())
    except urllib.error.HTTPError as e:
        return Answer(e.code, e.read())
    except urllib.error.URLError as e:
        # "No such name" stays wrong; "try again" (EAI_AGAIN) is DNS having a bad moment.
        if isinstance(e.reason, socket.gaierror) and e.reason.errno != socket.EAI_AGAIN:
            raise NoAnswer(f"{where}: the host does not resolve ({e.reason.strerror or e.reason})", error=True) from e
        raise NoAnswer(
            f"{where} does not answer now ({e.reason}): training starts, and its points are dropped "
            "(fsdp_tracker_points_dropped_total) until the server answers",
            error=False,
        ) from e
    except (TimeoutError, OSError) as e:
        raise NoAnswer(
            f"{where} does not answer now ({e}): training starts, and its points are dropped until it does",
            error=False,
        ) from e
