"""Connecting to a running agent's gRPC API: targets, TLS and token (`AgentClient` uses it).

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
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import grpc

from bpfdyno.client.errors import TARGET_ENV, ClientSetupError, is_unix_target
from bpfdyno.core.config import DEFAULT_SOCKET

TLS_CA_ENV = "BPFDYNO_TLS_CA"
TLS_CERT_ENV = "BPFDYNO_TLS_CERT"
TLS_KEY_ENV = "BPFDYNO_TLS_KEY"
TOKEN_FILE_ENV = "BPFDYNO_TOKEN_FILE"
#: Metadata key of the bearer token (what the agent's TCP listener checks).
AUTHORIZATION = "authorization"

#: gRPC channel options, as grpc.insecure_channel takes them.
ChannelOptions = Sequence[tuple[str, Any]]
#: For clients that stay connected to agents (the TUI, the cluster fan-out): come back
#: quickly to an agent that restarts (gRPC's back-off grows to two minutes). Not
#: ``grpc.min_reconnect_backoff_ms``: gRPC also takes it as the time a connection attempt
#: may take, and a TLS handshake with a busy or distant agent (or hundreds at once) can need
#: more than a fraction of a second; callers bound the wait with their own deadlines.
CHANNEL_OPTIONS: ChannelOptions = (
    ("grpc.initial_reconnect_backoff_ms", 250),
    ("grpc.max_reconnect_backoff_ms", 2000),
    ("grpc.max_receive_message_length", 16 << 20),
)


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


def _is_unix(target: str) -> bool:
    return is_unix_target(grpc_target(target))


def _read_env_file(env: str) -> bytes:
    path = os.environ[env]
    try:
        return Path(path).read_bytes()
    except OSError as e:
        raise ClientSetupError(
            f"cannot read {path} named by ${env} ({e.strerror}); fix the path or unset {env}"
        ) from e


@dataclass(frozen=True)
class ClientSecurity:
    """How a TCP target is reached: TLS, and the bearer token sent with every call.

    The token is added by client interceptors, not by gRPC's call credentials: those are a
    Python metadata plugin that gRPC destroys from one of its own threads, which can
    deadlock against the closing of the channel (grpc/grpc#42247; seen here, a CLI command
    hanging at exit under load).
    """

    credentials: grpc.ChannelCredentials
    token: str = ""


def security_from_env() -> ClientSecurity | None:
    """TLS and token for a TCP target from the environment; None: plain text.

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
        return ClientSecurity(creds)
    token = _read_env_file(TOKEN_FILE_ENV).decode("utf-8", "replace").strip()
    if not token:
        raise ClientSetupError(f"{token_file} named by ${TOKEN_FILE_ENV} is empty")
    return ClientSecurity(creds, token)


def _aio_details(d: Any, token: str) -> grpc.aio.ClientCallDetails:
    metadata = grpc.aio.Metadata(*(d.metadata or ()), (AUTHORIZATION, f"Bearer {token}"))
    return grpc.aio.ClientCallDetails(
        d.method, d.timeout, metadata, d.credentials, d.wait_for_ready
    )


class _AioToken:
    def __init__(self, token: str) -> None:
        self._token = token


# grpc.aio files an interceptor under the first kind of call it implements, so each kind
# needs an interceptor of its own.


class _AioTokenUU(_AioToken, grpc.aio.UnaryUnaryClientInterceptor):  # type: ignore[misc]
    async def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return await continuation(_aio_details(details, self._token), request)


class _AioTokenUS(_AioToken, grpc.aio.UnaryStreamClientInterceptor):  # type: ignore[misc]
    async def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return await continuation(_aio_details(details, self._token), request)


class _AioTokenSU(_AioToken, grpc.aio.StreamUnaryClientInterceptor):  # type: ignore[misc]
    async def intercept_stream_unary(self, continuation: Any, details: Any, requests: Any) -> Any:
        return await continuation(_aio_details(details, self._token), requests)


class _AioTokenSS(_AioToken, grpc.aio.StreamStreamClientInterceptor):  # type: ignore[misc]
    async def intercept_stream_stream(self, continuation: Any, details: Any, requests: Any) -> Any:
        return await continuation(_aio_details(details, self._token), requests)


def _aio_token_interceptors(token: str) -> list[_AioToken]:
    """Interceptors adding ``authorization: Bearer <token>`` to every call of an asyncio
    channel."""
    return [cls(token) for cls in (_AioTokenUU, _AioTokenUS, _AioTokenSU, _AioTokenSS)]


def aio_channel(
    target: str,
    options: ChannelOptions = (),
    security: ClientSecurity | Literal["env"] | None = "env",
) -> grpc.aio.Channel:
    """An asyncio channel to ``target``: TLS per the environment for TCP targets.

    Args:
        target: a Unix socket path or ``host:port``.
        options: gRPC channel options.
        security: TLS and token to use for a TCP target (None: plain text); by default read
            from the environment (pass it to open many channels with one reading).

    Raises:
        ClientSetupError: the TLS/token environment variables are unusable.
    """
    if _is_unix(target):
        security = None
    elif security == "env":
        security = security_from_env()
    if not isinstance(security, ClientSecurity):
        return grpc.aio.insecure_channel(grpc_target(target), options=options)
    interceptors = _aio_token_interceptors(security.token) if security.token else None
    return grpc.aio.secure_channel(
        grpc_target(target), security.credentials, options=options, interceptors=interceptors
    )
