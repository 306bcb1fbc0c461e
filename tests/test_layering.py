"""Data flows one way: each package imports only the layers it builds on.

The rules (docs/architecture.md): `core/` and the API contract (`rpc/`) are shared by all;
the analysis of trace files (`analysis/`) builds on them alone and serves the agent and clients;
sources build on `ebpf/`; tracing builds on sources; detection on tracing and sources; services
on detection, tracing and sources; the transports (`server/`) on services; clients (`client/`)
on the contract and the analysis; `cli/` and `app/` may wire anything. The TUI's own rules are
enforced by ruff (tui/ruff.toml).
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "agent" / "bpfdyno"

#: package -> the bpfdyno packages its modules may import (itself always allowed).
ALLOWED: dict[str, set[str]] = {
    "rpc": set(),
    "version": set(),
    "core": {"rpc", "version"},
    "ebpf": {"core"},
    "sources": {"core", "ebpf", "rpc"},
    "analysis": {"core", "rpc"},
    "tracing": {"analysis", "core", "ebpf", "rpc", "sources", "version"},
    "detection": {"core", "rpc", "sources", "tracing"},
    "services": {"analysis", "core", "detection", "rpc", "sources", "tracing", "version"},
    "server": {"core", "detection", "rpc", "services", "sources", "tracing", "version"},
    "exporters": {"core", "rpc", "version"},
    "client": {"analysis", "core", "rpc", "version"},
}


def _imports(path: Path) -> set[str]:
    """The bpfdyno modules a file imports (``bpfdyno.`` prefix removed)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("bpfdyno"):
            module = node.module.removeprefix("bpfdyno").lstrip(".")
            # `from bpfdyno.x import y` may name a module y: count x.y (and x itself).
            out |= {f"{module}.{a.name}" if module else a.name for a in node.names}
        elif isinstance(node, ast.Import):
            out |= {
                a.name.removeprefix("bpfdyno.") for a in node.names if a.name.startswith("bpfdyno.")
            }
    return out


def test_every_package_imports_only_the_layers_it_builds_on() -> None:
    wrong = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE)
        package = rel.parts[0].removesuffix(".py")
        if package not in ALLOWED or "v1" in rel.parts:
            continue  # cli/, app/ and __main__ wire everything; generated code imports itself
        module = ".".join(rel.with_suffix("").parts)
        for imported in _imports(path):
            top = imported.split(".")[0]
            if top in (package, "") or top in ALLOWED[package]:
                continue
            wrong.append(f"{module} imports {imported}")
    assert wrong == [], "\n".join(wrong)
