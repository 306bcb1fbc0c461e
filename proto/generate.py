"""Regenerate the committed gRPC/protobuf Python code from proto/bpfdyno/rpc/v1/*.proto.

Usage: python proto/generate.py [--out DIR]

The .proto paths mirror the Python package (bpfdyno/rpc/v1), compiled with -Iproto, so the
generated imports read ``from bpfdyno.rpc.v1 import ...``. Output goes to ``agent/bpfdyno/rpc/v1``
(the source of ``bpfdyno.rpc.v1``) unless --out names another directory; the test suite
regenerates into a temporary directory and diffs, so the committed code never drifts.
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
PACKAGE_DIR = Path("bpfdyno") / "rpc" / "v1"


def generate(out_dir: Path) -> list[Path]:
    """Compile every v1 .proto; write *_pb2.py, *_pb2.pyi, *_pb2_grpc.py into ``out_dir``."""
    protos = sorted((PROTO_DIR / PACKAGE_DIR).glob("*.proto"))
    if not protos:
        raise SystemExit(f"no .proto files under {PROTO_DIR / PACKAGE_DIR}")
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
        out_dir.mkdir(parents=True, exist_ok=True)
        written = []
        for f in sorted((Path(tmp) / PACKAGE_DIR).iterdir()):
            shutil.copyfile(f, out_dir / f.name)
            written.append(out_dir / f.name)
    return written


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "agent" / PACKAGE_DIR)
    args = parser.parse_args()
    for path in generate(args.out):
        print(path, file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
