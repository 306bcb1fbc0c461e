"""Connecting to a running agent's gRPC API (used by the CLI and the TUI)."""

from __future__ import annotations

import os

import grpc

from bpfdyno.config import DEFAULT_SOCKET

#: Environment variable naming the agent to talk to (a socket path or host:port).
TARGET_ENV = "BPFDYNO_TARGET"


def default_target() -> str:
    """The agent address used when none is given: $BPFDYNO_TARGET, else the default socket."""
    return os.environ.get(TARGET_ENV) or DEFAULT_SOCKET


def grpc_target(target: str) -> str:
    """Turn a socket path or ``host:port`` into a gRPC target string."""
    if target.startswith(("unix:", "dns:", "ipv4:", "ipv6:")):
        return target
    if target.startswith("/") or target.startswith("."):
        return f"unix:{os.path.abspath(target)}"
    return target


def explain_rpc_error(e: grpc.RpcError, target: str) -> str:
    """A one-line message for a failed call, with what to do about it."""
    code = e.code() if isinstance(e, grpc.Call) else None
    details = e.details() if isinstance(e, grpc.Call) else str(e)
    if code == grpc.StatusCode.UNAVAILABLE:
        hint = (
            "is the agent running? start it with `sudo bpfdyno serve`; if it runs elsewhere, "
            f"pass --socket PATH or --host HOST:PORT (or set {TARGET_ENV})"
        )
        if target.startswith("/") and os.path.exists(target) and not os.access(target, os.W_OK):
            hint = f"no permission on {target}: run as root or as a member of the socket's group"
        return f"cannot reach the agent at {target}: {hint}"
    name = code.name if code is not None else "ERROR"
    return f"agent at {target} answered {name}: {details}"


def channel(target: str) -> grpc.Channel:
    return grpc.insecure_channel(grpc_target(target))


def aio_channel(target: str) -> grpc.aio.Channel:
    return grpc.aio.insecure_channel(grpc_target(target))
