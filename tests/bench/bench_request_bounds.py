"""What the bounds on metric requests cost, and what they save: the matching of every series of a
store of the whole catalog's metrics, the old way (each pattern tried in turn for each series) and
through the index (`bpfdyno.core.store.NameFilter`, made once per distinct pattern set).

Run as one command: ``python tests/bench/bench_request_bounds.py [--repeat 20]``. Every
metric of the catalog gets a series per label set seen on this machine's agent (as many as
``--series`` in all), one point each; each query kind runs ``--repeat`` times, interleaved,
and the median is reported.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable, Sequence

from bpfdyno.app.catalog import CATALOG
from bpfdyno.core.metrics import Sample
from bpfdyno.core.store import MetricStore, name_filter
from bpfdyno.services.agent import MAX_NAME_PATTERNS


def linear(name: str, patterns: Sequence[str]) -> bool:
    """The matching before the index: every pattern in turn."""
    if not patterns:
        return True
    for p in patterns:
        if p.endswith("*"):
            if name.startswith(p[:-1]):
                return True
        elif name == p:
            return True
    return False


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--series", type=int, default=5000)
    args = parser.parse_args()
    specs = list(CATALOG)
    store = MetricStore(60.0, 1.0, max_series=args.series * 2)
    samples = [Sample(specs[i % len(specs)], 1.0, (("i", str(i)),)) for i in range(args.series)]
    store.append(time.time(), samples)
    names = [s.name for s in specs]
    queries: dict[str, Sequence[str]] = {
        "everything (no pattern)": (),
        f"{MAX_NAME_PATTERNS} patterns (the most allowed)": [
            *(f"{n}" for n in names[: MAX_NAME_PATTERNS // 2]),
            *(f"missing_{i}*" for i in range(MAX_NAME_PATTERNS - MAX_NAME_PATTERNS // 2)),
        ],
        "20,000 patterns (refused now)": [f"metric_{i}_of_a_long_list" for i in range(20_000)],
    }
    kinds: dict[str, Callable[[Sequence[str]], object]] = {}
    keys = [(v.spec.name, v.labels) for v in store.latest()]  # every series
    for label, pats in queries.items():

        def index(p: Sequence[str] = pats) -> object:
            wanted = name_filter(p)
            return [k for k in keys if wanted.matches(k[0])]

        def old(p: Sequence[str] = pats) -> object:
            return [k for k in keys if linear(k[0], p)]

        kinds[f"{label}, index"] = index

        kinds[f"{label}, one pattern after another"] = old
    times: dict[str, list[float]] = {k: [] for k in kinds}
    for _ in range(args.repeat):
        for k, fn in kinds.items():
            t0 = time.perf_counter()
            fn()
            times[k].append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    for i in range(args.repeat):
        name_filter([f"x{i}_{j}" for j in range(MAX_NAME_PATTERNS)])
    build = (time.perf_counter() - t0) / args.repeat
    print(
        f"{args.series} series of {len(specs)} metrics, median of {args.repeat}, load average "
        f"{os.getloadavg()[0]:.2f}\n\n| query | ms |\n|---|---|"
    )
    for k, ts in times.items():
        print(f"| {k} | {statistics.median(ts) * 1e3:.2f} |")
    print(
        f"| making the index of {MAX_NAME_PATTERNS} new patterns (once per set) | "
        f"{build * 1e3:.2f} |"
    )


if __name__ == "__main__":
    main()
