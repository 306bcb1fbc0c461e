"""The metric catalog: declared metrics by name, assembled from tables of specs.

Each source declares its metrics in its own ``metrics`` module (pure data: importing one
loads no BPF, NVML or psutil). Which tables make the daemon's catalog is the assembly's
knowledge (`bpfdyno.app.catalog`), not core's: the daemon, the gRPC API
(``ListMetricSpecs``), ``docs/metrics.md`` and the exporters are handed the catalog.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from bpfdyno.core.metrics import MetricSpec, MetricTable


class Catalog:
    """Declared metrics by name; a name declared by two tables is a programming error."""

    def __init__(self, tables: Iterable[MetricTable]) -> None:
        self.tables = tuple(tables)
        self._specs: dict[str, MetricSpec] = {}
        for table in self.tables:
            for spec in table:
                other = self._specs.get(spec.name)
                if other is not None:
                    raise ValueError(
                        f"metric {spec.name!r} is declared by both {other.source!r} and "
                        f"{spec.source!r}; declare each metric once"
                    )
                self._specs[spec.name] = spec

    def get(self, name: str) -> MetricSpec | None:
        return self._specs.get(name)

    def __iter__(self) -> Iterator[MetricSpec]:
        return iter(sorted(self._specs.values(), key=lambda s: s.name))

    def __len__(self) -> int:
        return len(self._specs)

    def __contains__(self, name: object) -> bool:
        return name in self._specs
