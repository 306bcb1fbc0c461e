"""Regenerate the committed gRPC/protobuf Python code from the .proto files under proto/.

Usage: python proto/generate.py [--out DIR]

Two APIs: bpfdyno's own (proto/bpfdyno/rpc/v1/*.proto) and the kubelet's pod-resources API
that the kubelet source reads (proto/bpfdyno/sources/kubelet/v1/api.proto, vendored). The
.proto paths mirror the Python packages (bpfdyno/rpc/v1, bpfdyno/sources/kubelet/v1),
compiled with -Iproto, so the generated imports read ``from bpfdyno.rpc.v1 import ...``.
Output goes under ``agent/`` (the source root: ``agent/bpfdyno/rpc/v1`` ...) unless --out
names another root; the test suite regenerates into a temporary directory and diffs, so the
committed code never drifts.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

from grpc_tools import protoc

ROOT = Path(__file__).resolve().parent.parent
PROTO_DIR = ROOT / "proto"
#: Each package of generated code, as a path below the source root.
PACKAGE_DIRS = (Path("bpfdyno") / "rpc" / "v1", Path("bpfdyno") / "sources" / "kubelet" / "v1")


def generate(out_root: Path) -> list[Path]:
    """Compile every .proto; write *_pb2.py, *_pb2.pyi, *_pb2_grpc.py under ``out_root``."""
    written = []
    for package in PACKAGE_DIRS:
        protos = sorted((PROTO_DIR / package).glob("*.proto"))
        if not protos:
            raise SystemExit(f"no .proto files under {PROTO_DIR / package}")
        with tempfile.TemporaryDirectory() as tmp:
            args = [
                "grpc_tools.protoc",
                f"-I{PROTO_DIR}",
                f"--python_out={tmp}",
                f"--pyi_out={tmp}",
                f"--grpc_python_out={tmp}",
                *(str(p.relative_to(PROTO_DIR)) for p in protos),
            ]
            if protoc.main(args) != 0:
                raise SystemExit("protoc failed; see the messages above")
            out_dir = out_root / package
            out_dir.mkdir(parents=True, exist_ok=True)
            for f in sorted((Path(tmp) / package).iterdir()):
                shutil.copyfile(f, out_dir / f.name)
                written.append(out_dir / f.name)
    return written


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "agent")
    args = parser.parse_args()
    for path in generate(args.out):
        print(path, file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
