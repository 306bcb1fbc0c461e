"""The process table's one vocabulary: rows and their protobuf form, filters, sort keys.

The agent, ``bpfdyno ps`` and ``bpfdyno top`` all use `bpfdyno.rpc.processes`; these tests
pin its rules, and that the CLI and the UI accept exactly the same sort keys.
"""

from __future__ import annotations

import dataclasses
import math
import re
from pathlib import Path

import pytest

from bpfdyno.cli.main import build_parser
from bpfdyno.cli.ps import format_table
from bpfdyno.rpc.processes import (
    SORT_KEYS,
    SORT_WORDS,
    THREAD_COLUMNS,
    ProcessList,
    ProcessRow,
    QueryError,
    filter_rows,
    parse_filter,
    row_from_pb,
    row_to_pb,
    sort_rows,
    threads_text,
)
from bpfdyno.rpc.v1 import kernel_pb2
from bpfdyno.tui.widgets.processes import PROCESS_COLUMNS, ProcessesView

NAN = float("nan")

ROWS = [
    ProcessRow(
        10,
        comm="p",
        cpu_ratio=0.5,
        rss_bytes=300,
        user="bob",
        cmdline="python train.py",
        slurm_job_id="7",
    ),
    ProcessRow(11, comm="kworker", cpu_ratio=NAN, user="alice"),
    ProcessRow(12, comm="p", cpu_ratio=0.9, rss_bytes=100, user="alice", cmdline="/bin/sleep 5"),
    ProcessRow(
        13,
        comm="p",
        cpu_ratio=0.5,
        rss_bytes=200,
        user="root",
        cmdline="Python eval.py",
        slurm_job_id="7",
        gpu_memory_bytes=1 << 30,
    ),
]


def test_sort_unknown_last_in_both_directions_and_ties_by_pid() -> None:
    assert [r.pid for r in sort_rows(ROWS, "cpu")] == [12, 10, 13, 11]
    assert [r.pid for r in sort_rows(ROWS, "cpu", descending=False)] == [10, 13, 12, 11]
    assert [r.pid for r in sort_rows(ROWS, "rss")] == [10, 13, 12, 11]
    assert [r.pid for r in sort_rows(ROWS, "user")] == [11, 12, 10, 13]
    assert [r.pid for r in sort_rows(ROWS, "pid")] == [10, 11, 12, 13]
    assert [r.pid for r in sort_rows(ROWS, "gpu_memory_bytes", descending=False)] == [
        13,
        10,
        11,
        12,
    ]


def test_sort_words_are_canonical_names_or_their_aliases() -> None:
    for key in SORT_KEYS:
        # The canonical word is the row attribute it sorts by.
        assert hasattr(ROWS[0], key.name), key.name
        for alias in key.aliases:
            assert sort_rows(ROWS, alias) == sort_rows(ROWS, key.name)
    assert [r.pid for r in sort_rows(ROWS, "")] == [12, 10, 13, 11]  # activity: CPU here


def test_sort_unknown_key() -> None:
    with pytest.raises(QueryError, match="unknown sort key 'nope'; use one of: activity, pid"):
        sort_rows(ROWS, "nope")


def test_filter_terms_and_words() -> None:
    def pids(text: str) -> list[int]:
        return [r.pid for r in filter_rows(ROWS, parse_filter(text))]

    assert pids("") == [10, 11, 12, 13]
    assert pids("python") == [10, 13]  # case-insensitive, command line
    assert pids("job=7") == [10, 13]
    assert pids("job=7 eval") == [13]
    assert pids("user=alice") == [11, 12]
    assert pids("comm=kworker") == [11]
    assert pids("pid=12") == [12]
    assert pids("kwork") == [11]  # the command name too


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "jobid=5",
            "unknown filter key 'jobid' in 'jobid=5'; use pid, user, comm, job, container, "
            "cgroup, pod (key=value) or a bare word",
        ),
        ("job=", "filter term 'job=' has no value; write job=VALUE"),
        ("pid=abc", "pid must be a number in 'pid=abc'; write pid=1234"),
        (
            "pod=train-0",
            "pod 'train-0': write NAMESPACE/NAME (e.g. default/train-0) or the pod's uid "
            "(kubectl get pod -n NAMESPACE NAME -o jsonpath='{.metadata.uid}')",
        ),
    ],
)
def test_filter_errors_say_how_to_fix(text: str, message: str) -> None:
    with pytest.raises(QueryError) as e:
        parse_filter(text)
    assert str(e.value) == message


def test_ps_and_top_accept_exactly_the_same_sort_keys(capsys: pytest.CaptureFixture[str]) -> None:
    old_ps = {"activity", "cpu", "rss", "net", "retransmits", "runq", "oncpu", "gpu_memory"}
    old_top = {"cpu", "rss", "oncpu", "runq", "offcpu", "tx", "rx", "retx", "gpu", "job"}
    both = {"pid", "user", "comm", "command"}
    words = SORT_WORDS | old_ps | old_top | both | {"size", "CPU", "cpu ", "bogus", ""}

    def ps_accepts(word: str) -> bool:
        try:
            build_parser().parse_args(["ps", "--sort", word])
        except SystemExit:
            return False
        return True

    def top_accepts(word: str) -> bool:
        try:
            ProcessesView().set_sort(word)
        except QueryError:
            return False
        return True

    accepted = {w for w in words if ps_accepts(w)}
    assert accepted == {w for w in words if top_accepts(w)}
    assert accepted == SORT_WORDS | {""}  # "": the default, activity
    assert old_ps | old_top | both <= accepted
    assert "unknown sort key 'size'; use one of: activity, pid" in capsys.readouterr().err
    # Every column of the UI sorts by a canonical key.
    assert {c.key for c in PROCESS_COLUMNS} <= {k.name for k in SORT_KEYS}


def test_row_fields_are_the_proto_fields() -> None:
    ours = [f.name for f in dataclasses.fields(ProcessRow)]
    assert ours == [f.name for f in kernel_pb2.ProcessRow.DESCRIPTOR.fields]


def test_pb_round_trip_keeps_every_value_and_every_unknown() -> None:
    full = ProcessRow(
        **{
            f.name: (
                f"v{i}"
                if f.type == "str"
                else True
                if f.type == "bool"
                else i + 0.5
                if f.type == "float"
                else i
            )
            for i, f in enumerate(dataclasses.fields(ProcessRow))
        }
    )
    assert row_from_pb(row_to_pb(full)) == full
    unknown = ProcessRow(pid=7, comm="x")
    msg = row_to_pb(unknown)
    # Unknown is unset on the wire (0 for the start time, which proto3 cannot leave unset).
    assert msg.ListFields() == [
        (msg.DESCRIPTOR.fields_by_name["pid"], 7),
        (msg.DESCRIPTOR.fields_by_name["comm"], "x"),
    ]
    back = row_from_pb(msg)
    assert math.isnan(back.cpu_ratio) and math.isnan(back.start_unix_seconds)
    assert back.gpu_memory_bytes is None and back.uid is None and back.tcp_tx_bytes is None
    assert back.rss_bytes == 0 and back.num_threads == 0  # always sent: never unknown


def test_activity_counts_cpu_and_network_the_same() -> None:
    assert ProcessRow(1, cpu_ratio=1.0).activity == 1.0
    assert (
        ProcessRow(
            1,
            cpu_ratio=NAN,
            tcp_tx_bytes_per_second=125e6,
            tcp_rx_bytes_per_second=0.0,
            udp_tx_bytes_per_second=0.0,
            udp_rx_bytes_per_second=0.0,
        ).activity
        == 1.0
    )
    assert ProcessRow(1).activity == 0.0  # nothing known: not hidden, just last


def test_the_proto_documents_every_sort_word() -> None:
    proto = Path(__file__).resolve().parents[2] / "proto/bpfdyno/rpc/v1/kernel.proto"
    text = proto.read_text()
    comment = text[text.index("message ListProcessesRequest") : text.index("string sort_by")]
    assert {w for w in SORT_WORDS if not re.search(rf"\b{w}\b", comment)} == set()


def test_scheduler_columns_read_as_threads() -> None:
    """On-CPU, run-queue and blocked time are thread-seconds per second: a trainer with 44
    mostly idle threads is "blocked 4402 %", which nobody can read; as threads it is 44."""
    assert [threads_text(v) for v in (0.99, 0.004, 44.02, 143.4, NAN)] == [
        "1.0",
        "0.0",
        "44.0",
        "143",
        "-",
    ]
    assert [field for _, field in THREAD_COLUMNS] == [
        "oncpu_ratio",
        "runq_wait_ratio",
        "offcpu_blocked_ratio",
    ]


def test_ps_and_the_ui_show_a_many_threaded_trainer_in_threads() -> None:
    trainer = ProcessRow(
        4242,
        user="ann",
        cmdline="python train.py",
        cpu_ratio=0.99,
        rss_bytes=3 << 30,
        oncpu_ratio=0.99,
        runq_wait_ratio=0.004,
        offcpu_blocked_ratio=44.02,
        num_threads=45,
    )
    header, row, footer = format_table(ProcessList((trainer,), 1.0, 300), 120).splitlines()
    assert header.split()[:7] == ["PID", "USER", "CPU%", "RSS", "ONCPU", "RUNQ", "BLOCK"]
    assert row.split()[:7] == ["4242", "ann", "99.0", "3.0G", "1.0", "0.0", "44.0"]
    assert footer == (
        "1 of 300 processes (ONCPU, RUNQ, BLOCK: threads on a CPU, waiting for one, blocked)"
    )
    cells = {c.key: c.cell(trainer) for c in PROCESS_COLUMNS}
    assert [cells[f] for _, f in THREAD_COLUMNS] == ["1.0", "0.0", "44.0"]
