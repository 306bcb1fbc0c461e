"""docs/metrics.md lists exactly the declared metrics."""

from __future__ import annotations

import ast
from pathlib import Path

from bpfdyno.core.metrics_doc import METRIC_MODULES, declare_all, render

ROOT = Path(__file__).resolve().parents[2]


def test_docs_metrics_md_is_current() -> None:
    expected = render(declare_all())
    current = (ROOT / "docs" / "metrics.md").read_text(encoding="utf-8")
    assert current == expected, "docs/metrics.md is stale: run `python -m bpfdyno.core.metrics_doc`"


def test_every_declaring_module_is_listed() -> None:
    declaring = set()
    for path in (ROOT / "agent").rglob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "declare"
                and isinstance(node.func.value, ast.Name)
                and node.func.value.id == "REGISTRY"
            ):
                rel = path.relative_to(ROOT / "agent").with_suffix("")
                declaring.add(".".join(rel.parts))
    assert declaring <= set(METRIC_MODULES), (
        f"add to METRIC_MODULES: {declaring - set(METRIC_MODULES)}"
    )


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
    for spec in declare_all():
        assert spec.unit, f"{spec.name} has no unit"
        if spec.unit.endswith("/s"):
            assert spec.name.endswith("_per_second"), spec.name
        elif spec.unit in suffix_for_unit:
            assert spec.name.endswith(suffix_for_unit[spec.unit]), spec.name
