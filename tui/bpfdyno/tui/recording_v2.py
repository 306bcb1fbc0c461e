"""Read recordings of version 2: the shape `bpfdyno top --record` wrote before the UI took the
API's records (version 3). Recordings are demos and evidence (a real GPU node's, shipped as
`bpfdyno top --demo`), so an old one is upgraded on reading, never refused.

Version 2 wrote the agent's own dicts: times as ``ts`` / ``*_s`` / ``*_ts``, states and kinds
as words (``"ok"``, ``"config pending"``, ``"ratio"``), labels as objects, points as
``[ts, value]`` pairs, a round's ``values`` one point each, the process table's ``rows``, event
attributes as strings. Version 3 holds the API's messages as JSON with their ``.proto`` field
names (`bpfdyno.tui.recorded`). `upgrade` maps one to the other field by field; a field
version 3 has no place for is dropped (e.g. a trainer's ``comm``).
"""

from __future__ import annotations

import re
from typing import Any

from bpfdyno.tui.codec import RecordingError

#: The version this module reads.
VERSION = 2

_INT = re.compile(r"-?[0-9]+")


def upgrade(obj: dict[str, Any], to_version: int) -> dict[str, Any]:
    """A version-2 recording object as the same recording of version ``to_version`` (3).

    Raises:
        RecordingError: a field that is not what version 2 wrote (the message names it).
    """
    try:
        out: dict[str, Any] = {
            "format": obj["format"],
            "version": to_version,
            "interval_s": obj.get("interval_s", 1.0),
            "status": _status(obj["status"]),
            "specs": [_spec(s) for s in obj.get("specs", [])],
            "history": [_history(h) for h in obj.get("history", [])],
            "frames": [_frame(f) for f in obj["frames"]],
            "unavailable": dict(obj.get("unavailable", {})),
        }
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise RecordingError(
            f"a version-2 recording with an unexpected field ({type(e).__name__}: {e}); "
            "record it again with this bpfdyno"
        ) from None
    return out


def _status(st: dict[str, Any]) -> dict[str, Any]:
    return {
        "version": st.get("version", ""),
        "hostname": st.get("hostname", ""),
        "kernel_release": st.get("kernel_release", ""),
        "agent_uptime_seconds": st.get("agent_uptime_s", 0.0),
        "host_uptime_seconds": st.get("host_uptime_s", 0.0),
        "pid": st.get("pid", 0),
        "config_source": st.get("config_source", ""),
        "started_unix_seconds": st.get("started_ts", 0.0),
        "collectors": [
            {
                "name": c["name"],
                "state": f"COLLECTOR_STATE_{c['state'].upper()}",
                "reason": c.get("reason", ""),
                "interval_seconds": c.get("interval_s", 0.0),
                "collections": c.get("collections", 0),
                "errors": c.get("errors", 0),
                "last_duration_seconds": c.get("last_duration_s", 0.0),
                "last_success_unix_seconds": c.get("last_success_ts", 0.0),
            }
            for c in st.get("collectors", [])
        ],
    }


def _spec(s: dict[str, Any]) -> dict[str, Any]:
    return {
        "name": s["name"],
        "kind": f"METRIC_KIND_{s['kind'].upper()}",
        "unit": s.get("unit", ""),
        "help": s.get("help", ""),
        "labels": list(s.get("labels", [])),
        "source": s.get("source", ""),
    }


def _labels(labels: dict[str, str]) -> list[dict[str, str]]:
    return [{"name": k, "value": v} for k, v in labels.items()]


def _history(h: dict[str, Any]) -> dict[str, Any]:
    return {
        "name": h["name"],
        "labels": _labels(h.get("labels", {})),
        "points": [{"unix_seconds": ts, "value": v} for ts, v in h.get("points", [])],
    }


def _round(r: dict[str, Any]) -> dict[str, Any]:
    return {
        "unix_seconds": r["ts"],
        "collector": r.get("collector", ""),
        "series": [
            {
                "name": v["name"],
                "labels": _labels(v.get("labels", {})),
                "points": [{"unix_seconds": r["ts"], "value": v["value"]}],
            }
            for v in r.get("values", [])
        ],
    }


def _processes(p: dict[str, Any]) -> dict[str, Any]:
    # Version 2's rows already carry the ProcessRow field names.
    return {
        "processes": list(p.get("rows", [])),
        "unix_seconds": p.get("ts", 0.0),
        "total_processes": p.get("total_processes", 0),
        "unavailable": dict(p.get("unavailable", {})),
    }


def _trainer(t: dict[str, Any]) -> dict[str, Any]:
    job = str(t.get("job_id", "") or "0")
    out = {
        "pid": t["pid"],
        "ancestors": list(t.get("ancestors", [])),
        "job_id": int(job) if job.isdigit() else 0,
        "first_poll_unix_seconds": t.get("first_seen_ts", 0.0),
        "last_poll_unix_seconds": t.get("last_poll_ts", 0.0),
        "state": "TRAINER_STATE_" + str(t.get("state", "idle")).upper().replace(" ", "_"),
        "role": "TRAINER_ROLE_" + str(t.get("role", "worker")).upper().replace(" ", "_"),
    }
    if t.get("trace_id"):
        out["trace_id"] = t["trace_id"]
    return out


def _attr(value: Any) -> dict[str, Any]:
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        return {"string_value": str(value)}
    if isinstance(value, int) or (isinstance(value, str) and _INT.fullmatch(value)):
        return {"int_value": int(value)}
    if isinstance(value, float):
        return {"double_value": value}
    return {"string_value": value}


def _event(e: dict[str, Any]) -> dict[str, Any]:
    return {
        "unix_ns": e["ts_ns"],
        "kind": e["kind"],
        "pid": e.get("pid", 0),
        "tid": e.get("tid", 0),
        "comm": e.get("comm", ""),
        "attrs": {k: _attr(v) for k, v in e.get("attrs", {}).items()},
    }


def _frame(f: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {
        "ts": f["ts"],
        "rounds": [_round(r) for r in f.get("rounds", [])],
        "events": [_event(e) for e in f.get("events", [])],
    }
    if f.get("status") is not None:
        out["status"] = _status(f["status"])
    if f.get("processes") is not None:
        out["processes"] = _processes(f["processes"])
    if f.get("trainers") is not None:
        out["trainers"] = [_trainer(t) for t in f["trainers"]]
    return out
