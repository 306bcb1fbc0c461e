"""Connecting to a running agent's gRPC API (used by the CLI and the TUI).

A Unix socket target is always plain (its permissions are the access control). A TCP target
uses TLS when any of these environment variables is set, so every command and the TUI
reach a secured TCP listener unchanged:

- ``BPFDYNO_TLS_CA``: PEM CA bundle that signed the agent's certificate (default: the
  system's roots);
- ``BPFDYNO_TLS_CERT`` and ``BPFDYNO_TLS_KEY``: this client's certificate and key, for an
  agent with ``grpc.tls_client_ca``;
- ``BPFDYNO_TOKEN_FILE``: file holding the agent's bearer token (``grpc.token_file``).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import grpc

from bpfdyno.core.config import DEFAULT_SOCKET

#: Environment variable naming the agent to talk to (a socket path or host:port).
TARGET_ENV = "BPFDYNO_TARGET"
TLS_CA_ENV = "BPFDYNO_TLS_CA"
TLS_CERT_ENV = "BPFDYNO_TLS_CERT"
TLS_KEY_ENV = "BPFDYNO_TLS_KEY"
TOKEN_FILE_ENV = "BPFDYNO_TOKEN_FILE"

#: gRPC channel options, as grpc.insecure_channel takes them.
ChannelOptions = Sequence[tuple[str, Any]]


class ClientSetupError(grpc.RpcError):  # type: ignore[misc]  # grpc is untyped here
    """The client's TLS/token settings are unusable; the message says which and what to do.

    An `RpcError` so that every caller's existing error handling reports it.
    """

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


#: Exit statuses shared by every CLI command.
EXIT_OK, EXIT_FAIL, EXIT_USAGE = 0, 1, 2


def add_target_argument(parser: argparse.ArgumentParser) -> None:
    """The ``--socket`` / ``--host`` option every client command takes (dest ``target``)."""
    parser.add_argument(
        "--socket",
        "--host",
        dest="target",
        default=None,
        help="agent to talk to: a Unix socket path or HOST:PORT "
        f"(default: ${TARGET_ENV} or {DEFAULT_SOCKET})",
    )


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
    if isinstance(e, ClientSetupError):
        return e.message
    code_fn, details_fn = getattr(e, "code", None), getattr(e, "details", None)
    code = code_fn() if callable(code_fn) else None
    details = (details_fn() if callable(details_fn) else str(e)) or ""
    if code == grpc.StatusCode.UNAVAILABLE:
        return unreachable_message(target, details)
    name = code.name if code is not None else "ERROR"
    return f"agent at {target} answered {name}: {details}"


def _is_unix(target: str) -> bool:
    return grpc_target(target).startswith("unix:")


def _read_env_file(env: str) -> bytes:
    path = os.environ[env]
    try:
        return Path(path).read_bytes()
    except OSError as e:
        raise ClientSetupError(
            f"cannot read {path} named by ${env} ({e.strerror}); fix the path or unset {env}"
        ) from e


def credentials_from_env() -> grpc.ChannelCredentials | None:
    """TLS (and token) credentials for a TCP target from the environment; None: plain text.

    Raises:
        ClientSetupError: a file cannot be read, a certificate lacks its key, a token is empty.
    """
    env = {k: os.environ.get(k, "") for k in (TLS_CA_ENV, TLS_CERT_ENV, TLS_KEY_ENV)}
    token_file = os.environ.get(TOKEN_FILE_ENV, "")
    if not any(env.values()) and not token_file:
        return None
    if bool(env[TLS_CERT_ENV]) != bool(env[TLS_KEY_ENV]):
        raise ClientSetupError(
            f"set both {TLS_CERT_ENV} and {TLS_KEY_ENV} (a client certificate and its key), "
            "or neither"
        )
    ca = _read_env_file(TLS_CA_ENV) if env[TLS_CA_ENV] else None
    key = _read_env_file(TLS_KEY_ENV) if env[TLS_KEY_ENV] else None
    cert = _read_env_file(TLS_CERT_ENV) if env[TLS_CERT_ENV] else None
    creds = grpc.ssl_channel_credentials(ca, key, cert)
    if not token_file:
        return creds
    token = _read_env_file(TOKEN_FILE_ENV).decode("utf-8", "replace").strip()
    if not token:
        raise ClientSetupError(f"{token_file} named by ${TOKEN_FILE_ENV} is empty")
    # Sent as "authorization: Bearer <token>" on every call; gRPC only sends it over TLS.
    return grpc.composite_channel_credentials(creds, grpc.access_token_call_credentials(token))


def channel(target: str, options: ChannelOptions = ()) -> grpc.Channel:
    """A blocking channel to ``target``: TLS per the environment for TCP targets.

    Raises:
        ClientSetupError: the TLS/token environment variables are unusable.
    """
    creds = None if _is_unix(target) else credentials_from_env()
    if creds is None:
        return grpc.insecure_channel(grpc_target(target), options=options)
    return grpc.secure_channel(grpc_target(target), creds, options=options)


def aio_channel(target: str, options: ChannelOptions = ()) -> grpc.aio.Channel:
    """An asyncio channel to ``target``: TLS per the environment for TCP targets.

    Raises:
        ClientSetupError: the TLS/token environment variables are unusable.
    """
    creds = None if _is_unix(target) else credentials_from_env()
    if creds is None:
        return grpc.aio.insecure_channel(grpc_target(target), options=options)
    return grpc.aio.secure_channel(grpc_target(target), creds, options=options)
