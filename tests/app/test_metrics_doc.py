"""docs/metrics.md lists exactly the catalog, and the catalog is every metric there is."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

from bpfdyno.app.catalog import CATALOG, TABLES
from bpfdyno.app.metrics_doc import render
from bpfdyno.core.metrics import MetricKind, MetricSpec, MetricTable

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "agent" / "bpfdyno"


def _module_name(path: Path) -> str:
    return ".".join(path.relative_to(ROOT / "agent").with_suffix("").parts)


def _importable(path: Path) -> bool:
    """Modules safe to import here: not the generated code, not a `__main__` (it runs)."""
    return "rpc/v1" not in path.as_posix() and path.name != "__main__.py"


def _table_modules() -> set[str]:
    """Modules that define a table the catalog lists."""
    out = set()
    for path in PACKAGE.rglob("*.py"):
        name = _module_name(path)
        module = importlib.import_module(name) if _importable(path) else None
        if module is not None and any(v in TABLES for v in vars(module).values()):
            out.add(name)
    return out


def test_docs_metrics_md_is_current() -> None:
    expected = render(CATALOG)
    current = (ROOT / "docs" / "metrics.md").read_text(encoding="utf-8")
    assert current == expected, "docs/metrics.md is stale: run `python -m bpfdyno.app.metrics_doc`"


def test_metrics_are_declared_only_in_the_catalogs_tables() -> None:
    """No MetricSpec or MetricTable is made anywhere but in the tables the catalog lists."""
    allowed = _table_modules() | {"bpfdyno.core.metrics"}
    makers = {"MetricSpec", "MetricTable"}
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id in makers
                and _module_name(path) not in allowed
            ):
                offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert offenders == [], "declare metrics in a source's metrics table, not here"


def test_every_spec_in_any_module_is_in_the_catalog() -> None:
    """A spec held by any module (directly or in a table of specs) is the catalog's own."""
    for path in PACKAGE.rglob("*.py"):
        if not _importable(path):
            continue
        module = importlib.import_module(_module_name(path))
        for value in vars(module).values():
            found: list[object] = [value]
            if isinstance(value, tuple | list):
                found += [x for v in value for x in (v if isinstance(v, tuple) else (v,))]
            elif isinstance(value, dict):
                found += [x for v in value.values() for x in (v if isinstance(v, tuple) else (v,))]
            for spec in found:
                if isinstance(spec, MetricSpec):
                    assert CATALOG.get(spec.name) is spec, f"{_module_name(path)}: {spec.name}"
            if isinstance(value, MetricTable):
                assert value in TABLES, f"{_module_name(path)} has a table the catalog lacks"


def test_every_metric_name_carries_its_unit() -> None:
    suffix_for_unit = {
        "bytes": "_bytes",
        "seconds": "_seconds",
        "ratio": "_ratio",
        "celsius": "_celsius",
        "watts": "_watts",
        "hertz": "_hertz",
        "joules": "_joules",
    }
    for spec in CATALOG:
        assert spec.unit, f"{spec.name} has no unit"
        # Prometheus' convention: a counter's unit comes before _total (_seconds_total).
        name = spec.name.removesuffix("_total") if spec.kind is MetricKind.COUNTER else spec.name
        if spec.unit.endswith("/s"):
            assert name.endswith("_per_second"), spec.name
        elif spec.unit in suffix_for_unit:
            assert name.endswith(suffix_for_unit[spec.unit]), spec.name
