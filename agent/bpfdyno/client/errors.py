"""The one family of client errors: why an agent gave no answer, in words that say what to do.

Every call of `bpfdyno.client.AgentClient` either returns the API's records or raises an
`AgentError`, whatever the caller (a CLI command, a job-wide fan-out, the TUI). gRPC status
codes are sorted into an `ErrorKind` here and nowhere else; the kind is what scripts read
(``--json`` writes it), the message is what people read.
"""

from __future__ import annotations

import enum
import os
import re

import grpc

#: Environment variable naming the agent to talk to (a socket path or host:port).
TARGET_ENV = "BPFDYNO_TARGET"


class ErrorKind(enum.StrEnum):
    """Why there is no answer (the value is what ``--json`` writes)."""

    #: Nothing answers at that address (not running, wrong address, a failed TLS handshake).
    UNREACHABLE = "unreachable"
    #: No answer within the deadline.
    TIMEOUT = "timeout"
    #: The agent refused the credentials (token, client certificate).
    UNAUTHENTICATED = "unauthenticated"
    #: The agent refused the requester (a process of someone else, an unsafe directory).
    PERMISSION_DENIED = "permission_denied"
    #: The agent refused the request itself (a bad argument; the message names the rule).
    REFUSED = "refused"
    #: The agent does not serve this part of the API (an older agent, a part turned off).
    UNIMPLEMENTED = "unimplemented"
    #: The agent answers, but this part of it is not running now (the reason says why).
    UNAVAILABLE = "unavailable"
    #: This client's own TLS/token settings are unusable.
    SETUP = "setup"
    #: Anything else the agent answered (an unknown trace id...).
    FAILED = "failed"

    @property
    def disconnected(self) -> bool:
        """Whether the agent itself cannot be talked to (rather than one of its parts)."""
        return self in (ErrorKind.UNREACHABLE, ErrorKind.TIMEOUT, ErrorKind.SETUP)


class AgentError(Exception):
    """A call to an agent failed; ``str(e)`` says why and what to do.

    Errors compare by kind and message, so the same failure on many hosts is said once.

    Attributes:
        kind: why, for programs.
        message: why, for people (with the fix).
        details: the agent's own words, when it answered ("" otherwise).
    """

    def __init__(self, kind: ErrorKind, message: str, details: str = "") -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.details = details

    def __eq__(self, other: object) -> bool:
        return isinstance(other, AgentError) and (self.kind, self.message) == (
            other.kind,
            other.message,
        )

    def __hash__(self) -> int:
        return hash((self.kind, self.message))


class ClientSetupError(AgentError):
    """The client's TLS/token settings are unusable; the message says which and what to do."""

    def __init__(self, message: str) -> None:
        super().__init__(ErrorKind.SETUP, message)


def is_unix_target(target: str) -> bool:
    """Whether ``target`` names a Unix socket (a path) rather than ``host:port``."""
    return target.startswith(("unix:", "/", "."))


def _cause(details: str) -> str:
    """The useful part of gRPC's connection error: "failed to connect to all addresses; last
    error: UNKNOWN: ipv4:10.0.0.5:50051: Failed to connect to remote host: Connection refused"
    -> "Failed to connect to remote host: Connection refused"; "...: connect failed: addr:
    unix:/run/x.sock error: No such file or directory" -> "No such file or directory"."""
    text = details.rsplit("last error: ", 1)[-1].rsplit(" error: ", 1)[-1]
    text = re.sub(r"^[A-Z_]+: (?:ipv4|ipv6|unix):\S+?: ", "", text).removesuffix(": OK")
    tls = re.search(r"OPENSSL_internal:(.+)$", text)
    return (tls.group(1) if tls else text).strip() or "no answer"


def unreachable(target: str, details: str = "") -> AgentError:
    """The agent at ``target`` cannot be talked to: why, and what to do about it."""
    path = target.removeprefix("unix:")
    if is_unix_target(target):
        if os.path.exists(path) and not os.access(path, os.W_OK):
            return AgentError(
                ErrorKind.UNREACHABLE,
                f"cannot reach the agent at {path}: no permission on the socket; run as root "
                "or as a member of the socket's group",
            )
        return AgentError(
            ErrorKind.UNREACHABLE,
            f"cannot reach the agent at {path} ({_cause(details)}): is it running? start it "
            "with `sudo bpfdyno serve`; if it runs elsewhere, pass --socket PATH or --host "
            f"HOST:PORT (or set {TARGET_ENV})",
        )
    if "handshake failed" in details.lower():
        return AgentError(
            ErrorKind.UNREACHABLE,
            f"the TLS handshake with the agent at {target} failed ({_cause(details)}): is "
            "$BPFDYNO_TLS_CA the CA that signed its certificate, and does the certificate name "
            "this address?",
        )
    return AgentError(
        ErrorKind.UNREACHABLE,
        f"cannot reach the agent at {target} ({_cause(details)}): is `bpfdyno serve` running "
        "there with [grpc] tcp on this port?",
    )


def timed_out(target: str, timeout_s: float, advice: str = "") -> AgentError:
    """No answer from the agent at ``target`` within ``timeout_s``."""
    return AgentError(
        ErrorKind.TIMEOUT,
        f"no answer from the agent at {target} within {timeout_s:g} s (overloaded, or a "
        "firewall drops the packets?)" + (f"; {advice}" if advice else ""),
    )


def agent_error(
    e: grpc.RpcError,
    target: str,
    service: str,
    *,
    timeout_s: float,
    connected: bool = False,
    timeout_advice: str = "",
) -> AgentError:
    """The `AgentError` of a failed call.

    Args:
        e: what gRPC raised.
        target: the agent's address.
        service: the API service called (``Agent``, ``Kernel``, ``Tracing``, ``Audit``).
        timeout_s: the call's deadline.
        connected: whether the channel was connected when the call failed: an UNAVAILABLE
            from a connected agent's service is that part not running, not a lost agent.
        timeout_advice: what to do about a deadline, in the caller's words.
    """
    code_fn, details_fn = getattr(e, "code", None), getattr(e, "details", None)
    code = code_fn() if callable(code_fn) else None
    details = (details_fn() if callable(details_fn) else str(e)) or ""
    if code == grpc.StatusCode.UNAVAILABLE and connected and service != "Agent":
        return AgentError(ErrorKind.UNAVAILABLE, f"{service}: {details}", details)
    if code == grpc.StatusCode.UNAVAILABLE or code is None:
        return unreachable(target, details)
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return timed_out(target, timeout_s, timeout_advice)
    if code == grpc.StatusCode.UNAUTHENTICATED:
        return AgentError(ErrorKind.UNAUTHENTICATED, f"refused the credentials: {details}", details)
    if code == grpc.StatusCode.PERMISSION_DENIED:
        return AgentError(ErrorKind.PERMISSION_DENIED, f"permission denied: {details}", details)
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        return AgentError(ErrorKind.REFUSED, f"refused the request: {details}", details)
    if code == grpc.StatusCode.UNIMPLEMENTED:
        return AgentError(
            ErrorKind.UNIMPLEMENTED,
            f"the agent at {target} does not serve the {service} API (an older agent, or that "
            "part is turned off in its configuration)",
            details,
        )
    return AgentError(ErrorKind.FAILED, f"the agent answered {code.name}: {details}", details)
