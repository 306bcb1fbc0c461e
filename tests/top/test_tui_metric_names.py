"""Every metric the UI and the cluster summary read by name is one the agent declares.

The UI asks its metrics model for series by name (`MetricsModel.latest`, ``history``...);
a misspelt or renamed metric would show ``-`` forever, silently. So every name asked while
every view renders a full synthetic node (GPUs with GPM, scheduler, network) must be in the
daemon's catalog, and so must the cluster summary's (`SUMMARY_METRICS`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from tui_helpers import make_app, settle, wait_until
from tui_synthetic import make_recording

from bpfdyno.app.catalog import CATALOG
from bpfdyno.client.cluster.summary import SUMMARY_METRICS
from bpfdyno.tui.model import MetricsModel

#: The model's methods that take a metric name first.
BY_NAME = ("latest", "history", "series", "label_values", "show", "unit")


def test_the_cluster_summary_reads_declared_metrics() -> None:
    assert [n for n in SUMMARY_METRICS if n not in CATALOG] == []


async def test_every_view_reads_declared_metrics(monkeypatch: pytest.MonkeyPatch) -> None:
    asked: set[str] = set()

    def recording(method: Callable[..., Any]) -> Callable[..., Any]:
        def ask(self: MetricsModel, name: str, *args: Any, **kwargs: Any) -> Any:
            asked.add(name)
            return method(self, name, *args, **kwargs)

        return ask

    for name in BY_NAME:
        monkeypatch.setattr(MetricsModel, name, recording(getattr(MetricsModel, name)))
    app, source = make_app(make_recording(processes=20, frames=3, gpus=2))
    async with app.run_test(size=(200, 50)) as pilot:
        await settle(pilot, app, source)
        for key, tab in (("1", "overview"), ("2", "processes"), ("3", "trainers"),
                         ("4", "events"), ("5", "agent")):  # fmt: skip
            await pilot.press(key)
            await wait_until(pilot, lambda tab=tab: app.active_tab == tab, what=tab)  # type: ignore[misc]
            await pilot.pause(0.2)
            app.render_views()
    # Every panel asked for its metrics (the GPU panel's GPM fields included)...
    assert {"cpu_utilization_ratio", "gpu_sm_active_ratio", "agent_rss_bytes"} <= asked
    assert len(asked) >= 40
    # ...and each of them is declared.
    assert sorted(n for n in asked if n not in CATALOG) == []
