"""Security of the optional TCP listener: TLS credentials and the bearer-token check.

The Unix socket needs none of this (its file permissions are the access control); the TCP
listener is a separate server, so the token check applies to every call on it and to no
call on the socket.
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from bpfdyno.core.config import ConfigError, GrpcSection

#: Metadata key of the token; gRPC sends call credentials under this (lower-case) name.
AUTH_METADATA_KEY = "authorization"

MISSING_TOKEN = (
    "this TCP listener needs a bearer token: set BPFDYNO_TOKEN_FILE to a file holding the "
    "agent's grpc.token_file token"
)
WRONG_TOKEN = (
    "the bearer token does not match the agent's grpc.token_file: check BPFDYNO_TOKEN_FILE"
)


@dataclass(frozen=True)
class TcpSecurity:
    """What the TCP listener enforces, read from the files `GrpcSection` names."""

    #: None: plain text (only with ``insecure_tcp = true``).
    credentials: grpc.ServerCredentials | None
    #: None: no token required.
    token: bytes | None
    #: Client certificates are required and verified.
    client_certs: bool

    @property
    def authenticated_by(self) -> str | None:
        """How TCP clients prove who they are ("client certificate", "bearer token"); None:
        they do not (plain text, or TLS with neither)."""
        if self.credentials is None:
            return None
        if self.client_certs:
            return "client certificate"
        return "bearer token" if self.token is not None else None

    def describe(self) -> str:
        """A short summary for the log, e.g. "TLS, bearer token"."""
        parts = ["TLS" if self.credentials is not None else "plain text"]
        if self.client_certs:
            parts.append("client certificates")
        if self.token is not None:
            parts.append("bearer token")
        return ", ".join(parts)


def _read(cfg: GrpcSection, key: str) -> bytes:
    path = getattr(cfg, key)
    try:
        return Path(path).read_bytes()
    except OSError as e:
        raise ConfigError(
            f"'grpc.{key}' cannot read {path} ({e.strerror}); fix the path or its permissions"
        ) from e


def load_tcp_security(cfg: GrpcSection) -> TcpSecurity:
    """Read the certificate, key, client CA and token files of ``cfg``.

    Raises:
        ConfigError: a file cannot be read (it was readable when the config was validated).
    """
    creds: grpc.ServerCredentials | None = None
    if cfg.tls_cert and cfg.tls_key:
        ca = _read(cfg, "tls_client_ca") if cfg.tls_client_ca else None
        creds = grpc.ssl_server_credentials(
            [(_read(cfg, "tls_key"), _read(cfg, "tls_cert"))],
            root_certificates=ca,
            require_client_auth=ca is not None,
        )
    token = _read(cfg, "token_file").strip() if cfg.token_file else None
    return TcpSecurity(creds, token or None, bool(creds is not None and cfg.tls_client_ca))


def _denied(handler: grpc.RpcMethodHandler, message: str) -> grpc.RpcMethodHandler:
    """A handler of the same shape as ``handler`` that answers UNAUTHENTICATED."""

    async def abort(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)

    des, ser = handler.request_deserializer, handler.response_serializer
    # A plain coroutine also serves streaming kinds in grpc.aio (it would write with
    # context.write); it aborts before that.
    if handler.request_streaming and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(abort, des, ser)
    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(abort, des, ser)
    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(abort, des, ser)
    return grpc.unary_unary_rpc_method_handler(abort, des, ser)


class TokenInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]  # grpc is untyped
    """Refuses every call whose ``authorization`` metadata is not ``Bearer <token>``."""

    def __init__(self, token: bytes) -> None:
        self._expected = b"Bearer " + token

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if handler is None:  # unknown method: let gRPC answer UNIMPLEMENTED
            return handler
        got: bytes | None = None
        for key, value in handler_call_details.invocation_metadata or ():
            if key == AUTH_METADATA_KEY:
                got = value.encode() if isinstance(value, str) else value
                break
        if got is None:
            return _denied(handler, MISSING_TOKEN)
        # Constant time, so the comparison does not leak how much of a guess was right.
        if not hmac.compare_digest(got, self._expected):
            return _denied(handler, WRONG_TOKEN)
        return handler
