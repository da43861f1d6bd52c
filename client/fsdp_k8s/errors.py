"""The client's errors: each one line a user can act on, never a traceback of urllib's."""

from __future__ import annotations


class ClientError(Exception):
    """A problem reaching or using the cluster (kubeconfig, network, credentials)."""


class ApiError(ClientError):
    """The API server answered with an error status; ``reason`` as in its Status object (NotFound, Forbidden...)."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(f"{message} ({status} {reason})" if message else f"{status} {reason}")
        self.status = status
        self.reason = reason


class InvalidTraining(ClientError):
    """An FSDPTraining the API would refuse: one ``field: message`` line per problem."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


class WaitTimeout(ClientError, TimeoutError):
    """``wait`` gave up before the training reached a phase it waited for."""
