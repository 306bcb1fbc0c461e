"""Many agents on one machine, each on its own loopback address: TLS material and a port.

The cluster benchmarks start hundreds of agents as TCP servers on 127.x.y.z addresses (the
whole 127/8 block is loopback on Linux), all with one server certificate naming every
address and one bearer token, as a real cluster's agents would be configured.
"""

from __future__ import annotations

import asyncio
import signal
import socket
import subprocess
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from bpfdyno.services.agent import AgentService
    from bpfdyno.services.tracing import TracingService


def make_pki(d: Path, addresses: Sequence[str], token: str) -> None:
    """Write ca.pem, server.pem/.key (valid for every address) and the token file into ``d``."""
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=d, check=True, capture_output=True)

    openssl("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.pem", "-days", "2",
            "-subj", "/CN=bench-ca")  # fmt: skip
    sans = ",".join(f"IP:{a}" for a in addresses)
    (d / "server.ext").write_text(f"subjectAltName={sans}\n")
    openssl("req", *ec, "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=agent")
    openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
            "-CAcreateserial", "-out", "server.pem", "-days", "2",
            "-extfile", "server.ext")  # fmt: skip
    (d / "token").write_text(token + "\n")


def free_port(addresses: Sequence[str]) -> int:
    """A TCP port that is free on every one of ``addresses``."""
    for _ in range(100):
        with socket.socket() as s:
            s.bind(("0.0.0.0", 0))
            port = int(s.getsockname()[1])
        try:
            for a in addresses:
                with socket.socket() as s:
                    s.bind((a, port))
        except OSError:
            continue
        return port
    raise SystemExit("no port is free on every agent address")


async def serve_agents(
    agents: Sequence[tuple[str, AgentService, TracingService]], port: int, pki: Path, token: str
) -> None:
    """Serve each (address, agent, tracing) on ``address:port`` with the TLS material of
    `make_pki` and ``token``, print "ready" once all are bound, and stop at SIGTERM."""
    import grpc

    from bpfdyno.rpc.v1 import agent_pb2_grpc, tracing_pb2_grpc
    from bpfdyno.server.agent import AgentServicer
    from bpfdyno.server.auth import TokenInterceptor
    from bpfdyno.server.tracing import TracingServicer

    creds = grpc.ssl_server_credentials(
        [((pki / "server.key").read_bytes(), (pki / "server.pem").read_bytes())]
    )
    servers = []
    for address, agent, tracing in agents:
        server = grpc.aio.server(interceptors=[TokenInterceptor(token.encode())])
        agent_pb2_grpc.add_AgentServicer_to_server(AgentServicer(agent), server)
        tracing_pb2_grpc.add_TracingServicer_to_server(TracingServicer(tracing), server)
        server.add_secure_port(f"{address}:{port}", creds)
        await server.start()
        servers.append(server)
    print("ready", flush=True)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    await asyncio.gather(*(s.stop(0) for s in servers))


@contextmanager
def agent_processes(argvs: Sequence[list[str]]) -> Iterator[None]:
    """Run one process per argv (each runs `serve_agents`) until the block ends: wait for
    each to print "ready", SIGTERM them all at the end (killed after 15 s)."""
    procs: list[subprocess.Popen[str]] = []
    try:
        for argv in argvs:
            procs.append(subprocess.Popen(argv, stdout=subprocess.PIPE, text=True))
        for proc in procs:
            assert proc.stdout is not None
            if proc.stdout.readline().strip() != "ready":
                raise SystemExit(f"an agent process did not start: {proc.args}")
        yield
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
