"""The domain errors every service raises, and nothing else does.

A service (`bpfdyno.services`) that cannot carry out a request raises one of these; each
transport maps them in exactly one place: gRPC status codes in `bpfdyno.server.errors`, the
legacy dyno RPC's ``{"status": "failed", "error": ...}`` replies, and the CLI's exit codes.
Every message says what went wrong *and what to do*; ``rule`` names the rule a request broke
(e.g. ``outside_allowed_dirs``) so callers and the audit log can tell refusals apart.
"""

from __future__ import annotations


class RequestError(Exception):
    """A request the agent cannot carry out.

    Attributes:
        rule: short name of the rule the request broke ("" when none applies).
    """

    def __init__(self, message: str, rule: str = "") -> None:
        # Every refusal names its rule, also where the message was written without it.
        if rule and f"'{rule}'" not in message:
            message = f"refused by rule '{rule}': {message}"
        super().__init__(message)
        self.rule = rule


class InvalidArgument(RequestError, ValueError):
    """The request is malformed or breaks a rule (gRPC INVALID_ARGUMENT)."""


class NotFound(RequestError):
    """The request names something the agent does not have (gRPC NOT_FOUND)."""


class Unavailable(RequestError):
    """The part of the agent that would answer is not running here (gRPC UNAVAILABLE)."""


class PermissionDenied(RequestError):
    """The requester may not do this (gRPC PERMISSION_DENIED)."""
