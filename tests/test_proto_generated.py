"""The committed generated gRPC code matches what the .proto files generate today: bpfdyno's
own API (bpfdyno.rpc.v1) and the kubelet's pod-resources API (bpfdyno.sources.kubelet.v1)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("bpfdyno/rpc/v1", "bpfdyno/sources/kubelet/v1")


@pytest.fixture(scope="module")
def fresh(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("generated")
    r = subprocess.run(
        [sys.executable, str(ROOT / "proto" / "generate.py"), "--out", str(out)],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr
    return out


@pytest.mark.parametrize("package", PACKAGES)
def test_generated_code_is_up_to_date(fresh: Path, package: str) -> None:
    generated = fresh / package
    committed = ROOT / "agent" / package
    names = sorted(p.name for p in generated.iterdir())
    assert names, package
    assert names == sorted(p.name for p in committed.iterdir() if "_pb2" in p.name), (
        "run `python proto/generate.py` and commit the result"
    )
    for name in names:
        assert (generated / name).read_bytes() == (committed / name).read_bytes(), (
            f"{package}/{name} is stale: run `python proto/generate.py` and commit the result"
        )


def test_the_kubelet_api_keeps_its_wire_names() -> None:
    """Vendored at a path of ours, the API keeps the kubelet's package: the methods are
    called /v1.PodResourcesLister/... on the wire."""
    from bpfdyno.sources.kubelet.v1 import api_pb2

    service = api_pb2.DESCRIPTOR.services_by_name["PodResourcesLister"]
    assert service.full_name == "v1.PodResourcesLister"
    assert [m.name for m in service.methods] == ["List", "GetAllocatableResources", "Get"]
