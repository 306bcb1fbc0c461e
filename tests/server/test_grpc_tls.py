"""The TCP listener with TLS, bearer tokens and client certificates, on real sockets.

Certificates are made here with the openssl CLI: a CA, a server certificate for 127.0.0.1
and localhost, a client certificate from that CA and one from an unrelated CA.
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from bpfdyno.app.daemon import Daemon
from bpfdyno.client.agent import AgentClient
from bpfdyno.client.connection import aio_channel
from bpfdyno.client.errors import AgentError, ErrorKind
from bpfdyno.core.config import ConfigError, load
from bpfdyno.rpc.v1 import agent_pb2 as pb
from bpfdyno.rpc.v1 import agent_pb2_grpc as pb_grpc
from bpfdyno.server.auth import MISSING_TOKEN, WRONG_TOKEN
from bpfdyno.server.grpc_server import GrpcServer
from bpfdyno.services.agent import AgentService

TOKEN = "s3cret-token-0123456789"
ENV_KEYS = ("BPFDYNO_TLS_CA", "BPFDYNO_TLS_CERT", "BPFDYNO_TLS_KEY", "BPFDYNO_TOKEN_FILE")


@dataclass(frozen=True)
class Pki:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    rogue_cert: Path  # signed by another CA
    rogue_key: Path
    token: Path


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def _ca(d: Path, name: str) -> None:
    _openssl(
        "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-keyout", f"{name}.key", "-out", f"{name}.pem", "-days", "2", "-subj", f"/CN={name}",
        cwd=d,
    )  # fmt: skip


def _leaf(d: Path, name: str, ca: str, ext: str) -> None:
    (d / f"{name}.ext").write_text(ext)
    _openssl(
        "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={name}", cwd=d,
    )  # fmt: skip
    _openssl(
        "x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.pem", "-CAkey", f"{ca}.key",
        "-CAcreateserial", "-out", f"{name}.pem", "-days", "2", "-extfile", f"{name}.ext",
        cwd=d,
    )  # fmt: skip


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    d = tmp_path_factory.mktemp("pki")
    _ca(d, "ca")
    _ca(d, "otherca")
    _leaf(d, "server", "ca", "subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    _leaf(d, "client", "ca", "extendedKeyUsage=clientAuth\n")
    _leaf(d, "rogue", "otherca", "extendedKeyUsage=clientAuth\n")
    token = d / "token"
    token.write_text(TOKEN + "\n")
    token.chmod(0o600)
    return Pki(
        d / "ca.pem", d / "server.pem", d / "server.key", d / "client.pem", d / "client.key",
        d / "rogue.pem", d / "rogue.key", token,
    )  # fmt: skip


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for k in ENV_KEYS:
        monkeypatch.delenv(k, raising=False)
    yield


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Served:
    sock: str
    addr: str


async def _serve(tmp_path: Path, **grpc_keys: str) -> AsyncIterator[Served]:
    sock = str(tmp_path / "agent.sock")
    addr = f"127.0.0.1:{_free_port()}"
    overrides = [("grpc.socket", f'"{sock}"'), ("grpc.tcp", f'"{addr}"')]
    overrides += [(f"grpc.{k}", f'"{v}"') for k, v in grpc_keys.items()]
    cfg = load(None, overrides)
    server = GrpcServer(cfg.grpc, AgentService(Daemon(cfg, [])))
    await server.start()
    try:
        yield Served(sock, addr)
    finally:
        await server.stop(0)


@pytest.fixture
async def token_agent(tmp_path: Path, pki: Pki) -> AsyncIterator[Served]:
    keys = {"tls_cert": str(pki.server_cert), "tls_key": str(pki.server_key)}
    async for served in _serve(tmp_path, token_file=str(pki.token), **keys):
        yield served


@pytest.fixture
async def mtls_agent(tmp_path: Path, pki: Pki) -> AsyncIterator[Served]:
    keys = {"tls_cert": str(pki.server_cert), "tls_key": str(pki.server_key)}
    async for served in _serve(tmp_path, tls_client_ca=str(pki.ca), **keys):
        yield served


async def _status(ch: grpc.aio.Channel) -> pb.GetStatusResponse:
    return await pb_grpc.AgentStub(ch).GetStatus(pb.GetStatusRequest(), timeout=5)


async def _call_error(ch: grpc.aio.Channel) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as ei:
        await _status(ch)
    return ei.value


async def test_token_over_tls(
    token_agent: Served, pki: Pki, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("BPFDYNO_TLS_CA", str(pki.ca))
    monkeypatch.setenv("BPFDYNO_TOKEN_FILE", str(pki.token))
    async with aio_channel(token_agent.addr) as ch:
        assert (await _status(ch)).pid == os.getpid()
        # Streaming calls pass the same check.
        stream = pb_grpc.AgentStub(ch).StreamMetrics(pb.StreamMetricsRequest(), timeout=1)
        with pytest.raises(grpc.aio.AioRpcError) as ei:
            async for _ in stream:
                pass
        assert ei.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED  # authorized, just idle

    wrong = tmp_path / "wrong-token"
    wrong.write_text("s3cret-token-0123456788")
    monkeypatch.setenv("BPFDYNO_TOKEN_FILE", str(wrong))
    async with aio_channel(token_agent.addr) as ch:
        err = await _call_error(ch)
        assert (err.code(), err.details()) == (grpc.StatusCode.UNAUTHENTICATED, WRONG_TOKEN)
        stream = pb_grpc.AgentStub(ch).StreamMetrics(pb.StreamMetricsRequest(), timeout=5)
        with pytest.raises(grpc.aio.AioRpcError) as ei:
            async for _ in stream:
                pass
        assert (ei.value.code(), ei.value.details()) == (
            grpc.StatusCode.UNAUTHENTICATED,
            WRONG_TOKEN,
        )

    monkeypatch.delenv("BPFDYNO_TOKEN_FILE")  # TLS, but no token
    async with aio_channel(token_agent.addr) as ch:
        err = await _call_error(ch)
        assert (err.code(), err.details()) == (grpc.StatusCode.UNAUTHENTICATED, MISSING_TOKEN)


async def test_token_over_tls_with_the_agent_client(
    token_agent: Served, pki: Pki, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """`AgentClient` (every command's client) carries the token on unary and streaming calls
    alike."""
    monkeypatch.setenv("BPFDYNO_TLS_CA", str(pki.ca))
    monkeypatch.setenv("BPFDYNO_TOKEN_FILE", str(pki.token))
    async with AgentClient(token_agent.addr) as agent:
        assert (await agent.status()).pid == os.getpid()
        with pytest.raises(TimeoutError):  # authorized: the stream is open, only idle
            async with asyncio.timeout(1):
                async for _ in agent.stream_metrics():
                    pass
    wrong = tmp_path / "wrong-token"
    wrong.write_text("s3cret-token-0123456788")
    monkeypatch.setenv("BPFDYNO_TOKEN_FILE", str(wrong))
    async with AgentClient(token_agent.addr) as agent:
        with pytest.raises(AgentError) as ei:
            async for _ in agent.stream_metrics():
                pass
        assert (ei.value.kind, ei.value.details) == (ErrorKind.UNAUTHENTICATED, WRONG_TOKEN)


async def test_plain_text_client_is_refused(token_agent: Served) -> None:
    async with grpc.aio.insecure_channel(token_agent.addr) as ch:
        assert (await _call_error(ch)).code() == grpc.StatusCode.UNAVAILABLE


async def test_unix_socket_needs_no_token(
    token_agent: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BPFDYNO_TOKEN_FILE", "/nonexistent")  # not even read for sockets
    async with aio_channel(token_agent.sock) as ch:
        assert (await _status(ch)).pid == os.getpid()


async def test_client_certificates(
    mtls_agent: Served, pki: Pki, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BPFDYNO_TLS_CA", str(pki.ca))
    async with aio_channel(mtls_agent.addr) as ch:  # no client certificate
        assert (await _call_error(ch)).code() == grpc.StatusCode.UNAVAILABLE
    monkeypatch.setenv("BPFDYNO_TLS_CERT", str(pki.rogue_cert))
    monkeypatch.setenv("BPFDYNO_TLS_KEY", str(pki.rogue_key))
    async with aio_channel(mtls_agent.addr) as ch:  # a certificate from another CA
        assert (await _call_error(ch)).code() == grpc.StatusCode.UNAVAILABLE
    monkeypatch.setenv("BPFDYNO_TLS_CERT", str(pki.client_cert))
    monkeypatch.setenv("BPFDYNO_TLS_KEY", str(pki.client_key))
    async with aio_channel(mtls_agent.addr) as ch:
        assert (await _status(ch)).pid == os.getpid()


async def _cli_status(addr: str, env: dict[str, str]) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        str(Path(sys.executable).parent / "bpfdyno"),
        "status",
        "--host",
        addr,
        env={**os.environ, **env},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_cli_status_over_tls(token_agent: Served, pki: Pki, tmp_path: Path) -> None:
    env = {"BPFDYNO_TLS_CA": str(pki.ca), "BPFDYNO_TOKEN_FILE": str(pki.token)}
    rc, out, err = await _cli_status(token_agent.addr, env)
    assert rc == 0, err
    assert out.startswith("bpfdyno 0.1.0 on "), out

    wrong = tmp_path / "wrong"
    wrong.write_text("nope")
    rc, out, err = await _cli_status(token_agent.addr, {**env, "BPFDYNO_TOKEN_FILE": str(wrong)})
    assert (rc, out) == (1, "")
    assert err == f"bpfdyno: refused the credentials: {WRONG_TOKEN}\n"

    missing = str(tmp_path / "missing")
    rc, out, err = await _cli_status(token_agent.addr, {**env, "BPFDYNO_TOKEN_FILE": missing})
    assert (rc, out) == (1, "")
    assert err == (
        f"bpfdyno: cannot read {missing} named by $BPFDYNO_TOKEN_FILE (No such file or "
        "directory); fix the path or unset BPFDYNO_TOKEN_FILE\n"
    )


def _config_error(tmp_path: Path, text: str) -> str:
    p = tmp_path / "bpfdyno.toml"
    p.write_text(text)
    with pytest.raises(ConfigError) as ei:
        load(p)
    return str(ei.value).removeprefix(f"{p}:")


def test_tcp_without_tls_is_refused(tmp_path: Path) -> None:
    assert _config_error(tmp_path, '[grpc]\ntcp = "127.0.0.1:50051"\n') == (
        "2: 'grpc.tcp' needs TLS: set grpc.tls_cert and grpc.tls_key to PEM files (see "
        "docs/deployment.md), or set grpc.insecure_tcp = true to serve plain text"
    )


def test_tcp_without_client_auth_is_refused(tmp_path: Path, pki: Pki) -> None:
    text = (
        f'[grpc]\ntcp = "127.0.0.1:50051"\ntls_cert = "{pki.server_cert}"\n'
        f'tls_key = "{pki.server_key}"\n'
    )
    assert _config_error(tmp_path, text) == (
        "2: 'grpc.tcp' needs client authentication: set grpc.token_file (a bearer token) "
        "and/or grpc.tls_client_ca (client certificates), or set grpc.insecure_tcp = true"
    )


def test_missing_and_bad_files_are_named(tmp_path: Path, pki: Pki) -> None:
    head = (
        f'[grpc]\ntcp = "127.0.0.1:50051"\ntls_cert = "{pki.server_cert}"\n'
        f'tls_key = "{pki.server_key}"\n'
    )
    missing = tmp_path / "no-such-token"
    assert _config_error(tmp_path, head + f'token_file = "{missing}"\n') == (
        f"5: 'grpc.token_file' cannot read {missing} (No such file or directory); fix the "
        "path or its permissions"
    )
    empty = tmp_path / "empty-token"
    empty.write_text("\n")
    assert _config_error(tmp_path, head + f'token_file = "{empty}"\n') == (
        f"5: 'grpc.token_file' {empty} is empty; write a token into it (e.g. `openssl rand "
        "-hex 32`)"
    )
    text = head.replace(str(pki.server_cert), str(pki.token)) + f'token_file = "{pki.token}"\n'
    assert _config_error(tmp_path, text) == (
        f"3: 'grpc.tls_cert' {pki.token} is not a PEM file (no '-----BEGIN CERTIFICATE-----' line)"
    )
    text = f'[grpc]\ntcp = "127.0.0.1:50051"\ntls_cert = "{pki.server_cert}"\n'
    assert _config_error(tmp_path, text) == (
        " 'grpc.tls_key' is missing: TLS needs both grpc.tls_cert and grpc.tls_key"
    )


def test_insecure_tcp_is_explicit_and_token_needs_tls(tmp_path: Path, pki: Pki) -> None:
    cfg = load(None, [("grpc.tcp", '"127.0.0.1:50051"'), ("grpc.insecure_tcp", "true")])
    assert (cfg.grpc.tcp, cfg.grpc.insecure_tcp) == ("127.0.0.1:50051", True)
    with pytest.raises(ConfigError) as ei:
        load(
            None,
            [
                ("grpc.tcp", '"127.0.0.1:50051"'),
                ("grpc.insecure_tcp", "true"),
                ("grpc.token_file", f'"{pki.token}"'),
            ],
        )
    assert str(ei.value) == (
        "command line: 'grpc.token_file' needs TLS: set grpc.tls_cert and grpc.tls_key as "
        "well (a token or client certificate is only checked over TLS)"
    )


def test_default_config_is_socket_only() -> None:
    g = load(None).grpc
    assert (g.tcp, g.tls_cert, g.tls_key, g.tls_client_ca, g.token_file, g.insecure_tcp) == (
        "",
        "",
        "",
        "",
        "",
        False,
    )


def test_a_token_others_may_read_is_refused_and_tcp_clients_only_read_by_default(
    tmp_path: Path, pki: Pki
) -> None:
    """Found by reading the code: the docs handed users a readable token while every TCP
    caller holding it acted as root (``tcp_uid`` defaulted to 0), and the token file's mode
    was never checked. Now a token others may read is refused, and authenticated TCP clients
    only read unless ``tcp_uid`` says whose rights they have."""
    token = tmp_path / "token"
    token.write_text(TOKEN + "\n")
    head = (
        f'[grpc]\ntcp = "127.0.0.1:50051"\ntls_cert = "{pki.server_cert}"\n'
        f'tls_key = "{pki.server_key}"\ntoken_file = "{token}"\n'
    )
    for mode in (0o644, 0o640, 0o604):
        token.chmod(mode)
        assert _config_error(tmp_path, head) == (
            f"5: 'grpc.token_file' {token} has mode {mode:04o}: others than its owner may "
            "read the token, and whoever holds it acts over TCP as grpc.tcp_uid; make it the "
            f"agent's alone (chmod 600 {token}) and hand operators a copy of their own"
        )
    token.chmod(0o600)
    os.chown(token, 65534, 0)
    assert _config_error(tmp_path, head) == (
        f"5: 'grpc.token_file' {token} belongs to uid 65534: that user may rewrite the "
        f"token; make it root's or the agent's (chown root {token})"
    )
    os.chown(token, 0, 0)
    p = tmp_path / "bpfdyno.toml"
    p.write_text(head)
    assert load(p).grpc.tcp_uid == -1
