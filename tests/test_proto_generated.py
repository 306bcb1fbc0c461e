"""The committed generated gRPC code matches what the .proto files generate today."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GENERATED = ROOT / "agent" / "bpfdyno" / "rpc" / "v1"


def test_generated_code_is_up_to_date(tmp_path: Path) -> None:
    r = subprocess.run(
        [sys.executable, str(ROOT / "proto" / "generate.py"), "--out", str(tmp_path)],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr
    fresh = sorted(p.name for p in tmp_path.iterdir())
    committed = sorted(p.name for p in GENERATED.iterdir() if "_pb2" in p.name)
    assert fresh == committed, "run `python proto/generate.py` and commit the result"
    for name in fresh:
        assert (tmp_path / name).read_bytes() == (GENERATED / name).read_bytes(), (
            f"{name} is stale: run `python proto/generate.py` and commit the result"
        )
