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


def unreachable_message(target: str, details: str = "") -> str:
    """Why the agent at ``target`` cannot be reached, and what to do about it."""
    if target.startswith("/") and os.path.exists(target) and not os.access(target, os.W_OK):
        return (
            f"cannot reach the agent at {target}: no permission on the socket; run as "
            "root or as a member of the socket's group"
        )
    # gRPC's details nest the cause ("failed to connect to all addresses; last error:
    # ...: connect failed: ... error: No such file or directory"): keep the innermost.
    cause = details.rsplit("error: ", 1)[-1].strip() if details else "no answer"
    return (
        f"cannot reach the agent at {target} ({cause}): is it running? "
        "start it with `sudo bpfdyno serve`; if it runs elsewhere, pass --socket PATH or "
        f"--host HOST:PORT (or set {TARGET_ENV})"
    )


def explain_rpc_error(e: grpc.RpcError, target: str) -> str:
    """A one-line message for a failed call, with what to do about it."""
    # Both grpc.Call (sync stubs) and grpc.aio.AioRpcError carry code() and details().
    code_fn, details_fn = getattr(e, "code", None), getattr(e, "details", None)
    code = code_fn() if callable(code_fn) else None
    details = (details_fn() if callable(details_fn) else str(e)) or ""
    if code == grpc.StatusCode.UNAVAILABLE:
        return unreachable_message(target, details)
    name = code.name if code is not None else "ERROR"
    return f"agent at {target} answered {name}: {details}"


def channel(target: str) -> grpc.Channel:
    return grpc.insecure_channel(grpc_target(target))


def aio_channel(target: str) -> grpc.aio.Channel:
    return grpc.aio.insecure_channel(grpc_target(target))
