"""Many agents on one machine, each on its own loopback address: TLS material and a port.

The cluster benchmarks start hundreds of agents as TCP servers on 127.x.y.z addresses (the
whole 127/8 block is loopback on Linux), all with one server certificate naming every
address and one bearer token, as a real cluster's agents would be configured.
"""

from __future__ import annotations

import socket
import subprocess
from collections.abc import Sequence
from pathlib import Path


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
