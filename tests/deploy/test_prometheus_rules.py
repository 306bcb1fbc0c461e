"""The shipped Prometheus rules, evaluated by Prometheus' own rule engine (promtool test
rules): series as the agents export them in, exact recorded values and alerts out."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
RULES = REPO / "deploy" / "prometheus" / "bpfdyno-rules.yml"


def promtool() -> str:
    binary = shutil.which("promtool")
    assert binary is not None, "promtool is not installed: run vagrant/bootstrap.sh test"
    return binary


def series(name: str, value: str, **labels: str) -> dict[str, str]:
    inner = ",".join(f'{k}="{v}"' for k, v in labels.items())
    return {"series": f"{name}{{{inner}}}", "values": value}


def run_tests(tmp_path: Path, test: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    spec = tmp_path / "rules_test.yml"  # JSON is YAML
    spec.write_text(
        json.dumps({"rule_files": [str(RULES)], "evaluation_interval": "15s", "tests": [test]})
    )
    return subprocess.run(
        [promtool(), "test", "rules", str(spec)], capture_output=True, text=True, timeout=60
    )


def test_the_rules_load() -> None:
    r = subprocess.run(
        [promtool(), "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "SUCCESS: 6 rules found" in r.stdout


# Job 7: four ranks on two nodes, rank 2 (node b) waits 0.41 s/s for a CPU, the rest ~0.01.
# Job 9: all ranks slow alike. Job 11: two ranks only (no median to stand out from).
INPUT = [
    series("rank_cpu_wait_ratio", "0.01x20", job_id="7", rank="0", instance="a:9"),
    series("rank_cpu_wait_ratio", "0.02x20", job_id="7", rank="1", instance="a:9"),
    series("rank_cpu_wait_ratio", "0.41x20", job_id="7", rank="2", instance="b:9"),
    series("rank_cpu_wait_ratio", "0.01x20", job_id="7", rank="3", instance="b:9"),
    *(
        series("rank_cpu_wait_ratio", "0.6x20", job_id="9", rank=str(r), instance="a:9")
        for r in range(4)
    ),
    series("rank_cpu_wait_ratio", "0.01x20", job_id="11", rank="0", instance="a:9"),
    series("rank_cpu_wait_ratio", "0.9x20", job_id="11", rank="1", instance="a:9"),
    series("straggler_confirmed", "0 0 0 1x17", job_id="7", rank="2", instance="b:9"),
    series("straggler_confirmed", "0x20", job_id="7", rank="0", instance="a:9"),
    series("job_hang", "0x3 1x16", job_id="13", instance="c:9"),
]


def test_the_job_wide_comparison_the_confirmed_straggler_and_the_hang(tmp_path: Path) -> None:
    test = {
        "interval": "15s",
        "input_series": INPUT,
        "promql_expr_test": [
            {
                "expr": "job_id:rank_cpu_wait_ratio:median",
                "eval_time": "1m",
                "exp_samples": [
                    {"labels": 'job_id:rank_cpu_wait_ratio:median{job_id="7"}', "value": 0.015},
                    {"labels": 'job_id:rank_cpu_wait_ratio:median{job_id="9"}', "value": 0.6},
                    {"labels": 'job_id:rank_cpu_wait_ratio:median{job_id="11"}', "value": 0.455},
                ],
            },
        ],
        "alert_rule_test": [
            {
                "eval_time": "2m",
                "alertname": "BpfdynoRankStandsOutJobWide",
                "exp_alerts": [
                    {
                        "exp_labels": {
                            "severity": "warning",
                            "job_id": "7",
                            "rank": "2",
                            "instance": "b:9",
                        },
                        "exp_annotations": {
                            "summary": "Job 7: rank 2 waits for a CPU 395m thread-seconds per "
                            "second more than the job's median"
                        },
                    }
                ],
            },
            # Not yet a minute above: pending, not firing.
            {"eval_time": "45s", "alertname": "BpfdynoRankStandsOutJobWide", "exp_alerts": []},
            {
                "eval_time": "1m",
                "alertname": "BpfdynoStragglerConfirmed",
                "exp_alerts": [
                    {
                        "exp_labels": {
                            "severity": "warning",
                            "job_id": "7",
                            "rank": "2",
                            "instance": "b:9",
                        },
                        "exp_annotations": {
                            "summary": "Job 7: rank 2 on b:9 is a confirmed straggler",
                            "description": "The agent on b:9 saw rank 2 stand out from its "
                            "job's ranks in most recent intervals; `bpfdyno events --job-id 7` "
                            "there says in what.",
                        },
                    }
                ],
            },
            {"eval_time": "30s", "alertname": "BpfdynoStragglerConfirmed", "exp_alerts": []},
            {
                "eval_time": "1m",
                "alertname": "BpfdynoJobHung",
                "exp_alerts": [
                    {
                        "exp_labels": {"severity": "critical", "job_id": "13", "instance": "c:9"},
                        "exp_annotations": {
                            "summary": "Job 13 hangs: its ranks on c:9 move no bytes",
                            "description": "`bpfdyno events --job-id 13` on c:9 names the rank "
                            "holding it and what its threads are doing.",
                        },
                    }
                ],
            },
        ],
    }
    r = run_tests(tmp_path, test)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "SUCCESS" in r.stdout


def test_a_wrong_expectation_fails(tmp_path: Path) -> None:
    """The harness can fail: rank 1 of job 7 is not flagged."""
    test = {
        "interval": "15s",
        "input_series": INPUT,
        "alert_rule_test": [
            {
                "eval_time": "2m",
                "alertname": "BpfdynoRankStandsOutJobWide",
                "exp_alerts": [{"exp_labels": {"severity": "warning", "job_id": "7", "rank": "1"}}],
            }
        ],
    }
    r = run_tests(tmp_path, test)
    assert r.returncode != 0
    assert "BpfdynoRankStandsOutJobWide" in r.stdout + r.stderr
