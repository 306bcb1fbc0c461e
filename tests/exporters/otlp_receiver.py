"""An in-process OTLP receiver (gRPC and HTTP) that decodes the real protobufs.

No OpenTelemetry collector is installable here, so the tests receive OTLP themselves with
the services and messages generated from the OTLP protos (``opentelemetry-proto``): every
request is kept decoded, with the headers it came with, for the test to inspect.
"""

from __future__ import annotations

import http.server
import ssl
import subprocess
import threading
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2 as svc
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2_grpc as svc_grpc


@dataclass(frozen=True)
class Received:
    request: svc.ExportMetricsServiceRequest
    headers: dict[str, str]


class _Store:
    def __init__(self) -> None:
        self.requests: list[Received] = []
        self.cond = threading.Condition()

    def add(self, received: Received) -> None:
        with self.cond:
            self.requests.append(received)
            self.cond.notify_all()

    def wait(self, count: int, timeout: float = 60.0) -> list[Received]:
        with self.cond:
            ok = self.cond.wait_for(lambda: len(self.requests) >= count, timeout)
            assert ok, f"{len(self.requests)} OTLP requests received, waited for {count}"
            return list(self.requests)


class _Servicer(svc_grpc.MetricsServiceServicer):  # type: ignore[misc]
    def __init__(self, store: _Store) -> None:
        self._store = store

    def Export(self, request: Any, context: grpc.ServicerContext) -> Any:
        headers = {k: v for k, v in context.invocation_metadata() if isinstance(v, str)}
        self._store.add(Received(request, headers))
        return svc.ExportMetricsServiceResponse()


class GrpcReceiver(_Store):
    """OTLP/gRPC on 127.0.0.1 (TLS with ``cert``/``key`` when given)."""

    def __init__(self, port: int = 0, cert: Path | None = None, key: Path | None = None) -> None:
        super().__init__()
        self.server = grpc.server(futures.ThreadPoolExecutor(4))
        svc_grpc.add_MetricsServiceServicer_to_server(_Servicer(self), self.server)
        if cert is not None and key is not None:
            creds = grpc.ssl_server_credentials([(key.read_bytes(), cert.read_bytes())])
            self.port = self.server.add_secure_port(f"127.0.0.1:{port}", creds)
        else:
            self.port = self.server.add_insecure_port(f"127.0.0.1:{port}")
        self.server.start()

    def stop(self) -> None:
        self.server.stop(grace=None)


class HttpReceiver(_Store):
    """OTLP/HTTP (protobuf) on 127.0.0.1, POST /v1/metrics (TLS with ``cert``/``key``)."""

    def __init__(self, cert: Path | None = None, key: Path | None = None) -> None:
        super().__init__()
        store = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                if self.path != "/v1/metrics" or self.headers.get_content_type() != (
                    "application/x-protobuf"
                ):
                    self.send_response(404)
                    self.end_headers()
                    return
                request = svc.ExportMetricsServiceRequest()
                request.ParseFromString(body)
                store.add(Received(request, {k.lower(): v for k, v in self.headers.items()}))
                out = svc.ExportMetricsServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        if cert is not None and key is not None:
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ctx.load_cert_chain(cert, key)
            self.httpd.socket = ctx.wrap_socket(self.httpd.socket, server_side=True)
        self.port = self.httpd.server_address[1]
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def self_signed(tmp: Path) -> tuple[Path, Path]:
    """A certificate for localhost / 127.0.0.1 and its key (it is its own CA)."""
    cert, key = tmp / "otlp.pem", tmp / "otlp.key"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
         "-nodes", "-days", "2", "-keyout", str(key), "-out", str(cert), "-subj", "/CN=localhost",
         "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"],
        check=True, capture_output=True,
    )  # fmt: skip
    return cert, key


def attributes(kvs: Any) -> dict[str, Any]:
    """OTLP KeyValues as a dict of plain values."""
    out: dict[str, Any] = {}
    for kv in kvs:
        which = kv.value.WhichOneof("value")
        out[kv.key] = getattr(kv.value, which) if which else None
    return out


def metrics_by_name(request: svc.ExportMetricsServiceRequest) -> dict[str, Any]:
    """Every Metric message of a request by name."""
    return {
        m.name: m for rm in request.resource_metrics for sm in rm.scope_metrics for m in sm.metrics
    }
