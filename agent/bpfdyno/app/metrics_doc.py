"""Render docs/metrics.md from the metric catalog, so the docs list exactly what is emitted.

Usage: python -m bpfdyno.app.metrics_doc [--check] [PATH]
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path

from bpfdyno.app.catalog import CATALOG
from bpfdyno.core.catalog import Catalog

HEADER = """\
# Metrics

Generated from the metric catalog by `python -m bpfdyno.app.metrics_doc`; a test fails when this
file and the code disagree. Every metric is declared once (name, kind, unit, help, labels) and
every exporter and API reads that same table.

Conventions:
- The unit is part of the name: `_bytes`, `_seconds`, `_ratio` (a fraction 0..1, never a
  percentage), `_per_second`, `_celsius`, `_watts`, `_hertz`, `_total` (a cumulative count).
- Kinds: **gauge** (a level), **rate** (per second over the last interval, from cumulative
  counters), **ratio** (fraction of the last interval), **counter** (cumulative since a start).
- A value that cannot be read is *absent* for that round, never reported as 0.
- Rates and ratios are per collection interval (`[daemon] interval_s`, 1 s by default; per
  collector with `[collectors.<name>] interval_s`), not averages since start.

For dynolog users: `cpu_u`/`cpu_s`/`cpu_i` (percent) are `cpu_user_ratio`/`cpu_system_ratio`/
`cpu_idle_ratio` with `cpu="total"` (ratio); `rx_bytes.<dev>` (per-interval delta) is
`net_rx_bytes_per_second{interface="<dev>"}` (per second); `uptime` is `uptime_seconds`.
"""


def render(catalog: Catalog) -> str:
    by_source: dict[str, list[str]] = defaultdict(list)
    for spec in catalog:
        labels = ", ".join(f"`{lab}`" for lab in spec.labels) or "—"
        help_text = spec.help.replace("|", "\\|")
        by_source[spec.source or "other"].append(
            f"| `{spec.name}` | {spec.kind.value} | {spec.unit} | {labels} | {help_text} |"
        )
    out = [HEADER]
    for source in sorted(by_source):
        out.append(f"\n## Collector `{source}`\n")
        out.append("| name | kind | unit | labels | meaning |")
        out.append("|---|---|---|---|---|")
        out.extend(by_source[source])
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("path", nargs="?", type=Path, default=Path("docs/metrics.md"))
    parser.add_argument("--check", action="store_true", help="exit 1 if the file is stale")
    args = parser.parse_args(argv)
    text = render(CATALOG)
    if args.check:
        current = args.path.read_text(encoding="utf-8") if args.path.exists() else ""
        if current != text:
            print(f"{args.path} is stale: run `python -m bpfdyno.app.metrics_doc`", file=sys.stderr)
            return 1
        return 0
    args.path.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
