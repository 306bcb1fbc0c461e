"""Local safety, round two: attacks by unprivileged users on a real `bpfdyno serve`.

Every test runs the agent as a node runs it — the gRPC socket at its default mode (every
local user may connect; each call acts as its caller), the legacy port, the Kineto socket
directory shared by all — and real users created for the test (``mallory`` attacks,
``alice`` works) run the CLI, PyTorch trainers and raw clients through ``setpriv``. After
each attack a legitimate trace by another user still works, and the agent is gone within
5 s of SIGTERM.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import os
import struct
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from local_user import local_user
from served_site import (
    USER_CLIENT,
    ServedSite,
    served_site,
    stops_in_time,
    traced,
    trainer,
)
from tracing_harness import TRAINERS, dyno_gputrace_bytes, unframe

from bpfdyno.rpc.v1 import tracing_pb2 as pb

pytestmark = [pytest.mark.root, pytest.mark.slow, pytest.mark.usefixtures("torch_ready")]

WRITTEN = pb.PROCESS_TRACE_STATE_WRITTEN


async def trace(site: ServedSite, user: str, *argv: str) -> dict[str, object]:
    """``bpfdyno gputrace ARGV --json`` as ``user``; the decoded output."""
    r = await site.cli(user, "gputrace", *argv, "--json")
    assert r.returncode == 0, r.stdout + r.stderr + site.diagnostics()
    out: dict[str, object] = json.loads(r.stdout)
    return out


async def test_a_users_traces_are_its_own(short_tmp: Path, run_mode: str) -> None:
    """Found: ``bpfdyno trainers`` showed other users' trace ids, and with one a user read
    another user's trace path and full summary. Now another user's trace is not found,
    exactly like an unknown id — the rule of ``bpfdyno audit``."""
    async with served_site(short_tmp, mode=run_mode) as site:
        pid = await trainer(site, "alice")
        log_file = str(site.dirs["alice"] / "a.json")
        # A duration trace: it stays open ~8 s (Kineto starts it 7 s after delivery).
        started = await trace(site, "alice", "--pids", str(pid), "--log-file", log_file,
                              "--duration-ms", "200")  # fmt: skip
        trace_id = str(started["request"]["trace_id"])  # type: ignore[index]
        theirs, hers = await asyncio.gather(
            site.client("mallory", "peek", site.sock, trace_id),
            site.client("alice", "peek", site.sock, trace_id),
        )
        assert theirs == {
            "get": "NOT_FOUND",
            "watch": "NOT_FOUND",
            "summary": "NOT_FOUND",
            "trainer_trace_ids": {str(pid): ""},
        }
        assert hers["get"] == hers["watch"] == trace_id  # type: ignore[index]
        assert hers["trainer_trace_ids"] == {str(pid): trace_id}  # type: ignore[index]
        done = await site.wait_done(trace_id)  # root sees every trace
        assert [p.state for p in done.processes] == [WRITTEN]
        written = done.processes[0].output_path
        # The CLI says the same as for an id that never existed, and nothing about hers.
        r = await site.cli("mallory", "trace-summary", "--trace-id", trace_id)
        unknown = await site.cli("mallory", "trace-summary", "--trace-id", "0123456789abcdef")
        assert r.returncode == unknown.returncode != 0
        assert r.stderr.replace(trace_id, "ID") == unknown.stderr.replace("0123456789abcdef", "ID")
        assert written not in r.stdout + r.stderr
        r = await site.cli("alice", "trace-summary", "--trace-id", trace_id, "--json")
        assert r.returncode == 0, r.stdout + r.stderr
        assert [p["path"] for p in json.loads(r.stdout)["processes"]] == [written]
        stops_in_time(site)


async def test_parked_summaries_stall_only_their_user(short_tmp: Path, run_mode: str) -> None:
    """Found: a user swapped its trace for a FIFO; 8 summaries took every worker of the
    agent's pool, another user's summary hung, and SIGTERM did not stop the agent. A FIFO is
    now refused at once; what still takes time — her file swapped for a gzip bomb that is
    read up to the JSON limit (~10 s each), asked for 8 times at once — runs in her own
    lane, one call after another, and the other user's summary comes within its 30 s (all
    users in one lane, it would wait behind ~80 s of hers)."""
    async with served_site(short_tmp, mode=run_mode) as site:
        hers, theirs = await asyncio.gather(trainer(site, "alice"), trainer(site, "mallory"))
        m_file = str(site.dirs["mallory"] / "m.json")
        m = await trace(site, "mallory", "--pids", str(theirs), "--log-file", m_file,
                        "--iterations", "2", "--wait", "--timeout", "90")  # fmt: skip
        m_path = m["trace"]["processes"][0]["output_path"]  # type: ignore[index]
        m_id = str(m["request"]["trace_id"])  # type: ignore[index]
        r = await site.run("mallory", "sh", "-c", f"rm {m_path} && mkfifo {m_path}")
        assert r.returncode == 0, r.stderr
        r = await site.cli("mallory", "trace-summary", "--trace-id", m_id, "--json", timeout=10)
        [row] = json.loads(r.stdout)["processes"]
        assert row["error"] == f"{m_path} is not a regular file, not a trace file"
        bomb = site.dirs["mallory"] / "bomb.json.gz"
        await asyncio.to_thread(gzip_bomb, bomb, 8)
        os.chown(bomb, site.users["mallory"].uid, site.users["mallory"].gid)
        r = await site.run("mallory", "sh", "-c", f"rm {m_path} && mv {bomb} {m_path}")
        assert r.returncode == 0, r.stderr
        argv = ["trace-summary", "--trace-id", m_id, "--socket", site.sock]
        parked = [
            subprocess.Popen(
                site.users["mallory"].wrap([sys.executable, "-m", "bpfdyno", *argv]),
                env=site.users["mallory"].env(),
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            for _ in range(8)
        ]
        try:
            await asyncio.sleep(3)  # their calls are in, one reading, seven waiting
            assert all(p.poll() is None for p in parked)
            a_file = str(site.dirs["alice"] / "a.json")
            a = await trace(site, "alice", "--pids", str(hers), "--log-file", a_file,
                            "--iterations", "2", "--wait", "--timeout", "30")  # fmt: skip
            a_path = a["trace"]["processes"][0]["output_path"]  # type: ignore[index]
            a_id = str(a["request"]["trace_id"])
            r = await site.cli("alice", "trace-summary", "--trace-id", a_id, "--json",
                               timeout=30)  # fmt: skip
            assert r.returncode == 0, r.stderr
            [row] = json.loads(r.stdout)["processes"]
            assert (row["path"], row["error"]) == (a_path, "")
            assert sum(p.poll() is None for p in parked) >= 4, "hers were not still waiting"
            stops_in_time(site)
        finally:
            for p in parked:
                p.kill()
                p.wait()


def gzip_bomb(path: Path, gib: int) -> None:
    """A valid gzip trace whose JSON is ``gib`` GiB of whitespace (~1 MB per GiB)."""
    spaces = gzip.compress(b" " * (64 << 20), 9)
    with open(path, "wb") as f:
        f.write(gzip.compress(b'{"schemaVersion": 1, "traceEvents": [', 9))
        for _ in range(gib * 16):
            f.write(spaces)
        f.write(gzip.compress(b'{"ph": "X", "name": "x", "pid": 1, "tid": 1, "ts": 1, '
                              b'"dur": 1}]}\n', 9))  # fmt: skip


async def test_huge_merges_stall_only_their_user(short_tmp: Path, run_mode: str) -> None:
    """Found: a 20 MB gzip trace inflating to ~19 GB held the single merge thread for
    134 s, and another user's trace stayed "merging" for 116 s. The attacker's "trainers"
    here are 4 Kineto clients of hers, each handing in a bomb as its trace: each merge is
    refused at the JSON limit (~10 s), one after another in her lane, while the other
    user's trace is merged within its 30 s (all users in one lane, it would wait ~40 s)."""
    async with served_site(short_tmp, mode=run_mode) as site:
        hers = await trainer(site, "alice")
        bomb = site.dirs["mallory"] / "source.json.gz"
        await asyncio.to_thread(gzip_bomb, bomb, 8)
        os.chown(bomb, site.users["mallory"].uid, site.users["mallory"].gid)
        fakes = [
            subprocess.Popen(
                site.users["mallory"].wrap(
                    [sys.executable, USER_CLIENT, "kineto", str(site.socket_dir), str(bomb)]
                ),
                env=site.users["mallory"].env(),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
            for _ in range(4)
        ]
        try:
            theirs = []
            for fake in fakes:
                assert fake.stdout is not None
                theirs.append(json.loads(fake.stdout.readline())["pid"])
                await site.wait_registered(theirs[-1])
            m = await trace(site, "mallory", "--pids", ",".join(map(str, theirs)),
                            "--process-limit", "4",
                            "--log-file", str(site.dirs["mallory"] / "m.json.gz"))  # fmt: skip
            for fake in fakes:
                assert "wrote" in await asyncio.to_thread(fake.stdout.readline)  # type: ignore[union-attr]
            m_id = str(m["request"]["trace_id"])
            await wait_for_state(site, m_id, lambda s: s == pb.PROCESS_TRACE_STATE_MERGING)
            a = await trace(site, "alice", "--pids", str(hers), "--log-file",
                            str(site.dirs["alice"] / "a.json"), "--iterations", "2", "--wait",
                            "--timeout", "30")  # fmt: skip
            [part] = a["trace"]["processes"]  # type: ignore[index]
            assert part["state"] == "PROCESS_TRACE_STATE_WRITTEN"
            assert part["kernel_tracks"]["state"] == "merged", part
            # Hers was merged while the bombs were still being merged.
            their_parts = (await site.stub().GetTrace(pb.GetTraceRequest(trace_id=m_id))).processes
            assert any(p.state == pb.PROCESS_TRACE_STATE_MERGING for p in their_parts)
            stops_in_time(site)  # with a bomb's merge running
        finally:
            for fake in fakes:
                fake.kill()
                fake.wait()


async def wait_for_state(
    site: ServedSite, trace_id: str, ok: Callable[[int], bool], timeout: float = 60
) -> None:
    async with asyncio.timeout(timeout):
        while True:
            view = await site.stub().GetTrace(pb.GetTraceRequest(trace_id=trace_id))
            if view.processes and ok(view.processes[0].state):
                return
            await asyncio.sleep(0.1)


async def test_thousands_of_fake_trainers_from_many_users(short_tmp: Path) -> None:
    """8 users register 512 fake trainers each (their quota) and keep them polling: 4096,
    the registry's size. The next user's real trainer still registers and is traced."""
    attackers = [f"m{i}" for i in range(8)]
    async with served_site(short_tmp, users=("alice", *attackers)) as site:
        floods = [
            asyncio.create_task(
                site.client(m, "flood", str(site.socket_dir), "512", "40", timeout=120)
            )
            for m in attackers
        ]
        async with asyncio.timeout(60):  # every fake trainer registered
            while True:
                r = await site.cli("alice", "trainers", "--json")
                if len(json.loads(r.stdout).get("trainers", [])) >= 4096:
                    break
                await asyncio.sleep(1)
        pid = await trainer(site, "alice")
        await traced(site, "alice", pid)
        status = await site.cli("alice", "status")
        assert "gave their place to other users'" in status.stdout
        stops_in_time(site)
        for f in floods:
            f.cancel()


async def test_replies_nobody_reads_fill_only_their_users_buffer(short_tmp: Path) -> None:
    """Found here: replies are charged to the agent's socket until read, so 64 sockets that
    poll and never read (278 unread replies suffice) filled its send buffer, and no
    trainer on the node got a reply — no config was delivered to anyone. Each user's
    replies now go out from a socket of its own."""
    async with served_site(short_tmp) as site:
        mute = asyncio.create_task(
            site.client("mallory", "flood", str(site.socket_dir), "64", "60", "mute")
        )
        pid = await trainer(site, "alice")
        await traced(site, "alice", pid)
        stops_in_time(site)
        mute.cancel()


async def test_kinetos_ondemand_directory_rule(short_tmp: Path) -> None:
    """A trainer whose libkineto accepts on-demand files only under its
    KINETO_ONDEMAND_TRACE_DIR: a file elsewhere (or with '..') is refused up front, with
    the reason and the fix, instead of being followed at a name Kineto will not write."""
    async with served_site(short_tmp) as site:
        alice = site.dirs["alice"]
        lib = alice / "libkineto.so"
        subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(lib),
                        str(TRAINERS / "ondemand_rule.c")], check=True)  # fmt: skip
        ondemand = alice / "ondemand"
        ondemand.mkdir()
        os.chown(ondemand, site.users["alice"].uid, site.users["alice"].gid)
        ruled = await trainer(site, "alice", "--load", str(lib),
                              KINETO_ONDEMAND_TRACE_DIR=str(ondemand))  # fmt: skip
        plain = await trainer(site, "alice")  # PyTorch 2.13 as it is: no such rule
        refused = await site.cli("alice", "gputrace", "--pids", str(ruled), "--log-file",
                                 str(alice / "t.json"))  # fmt: skip
        assert refused.returncode == 2, refused.stdout + refused.stderr
        assert "kineto_ondemand_dir" in refused.stderr
        assert f"pid {ruled}" in refused.stderr and str(lib) in refused.stderr
        assert f"KINETO_ONDEMAND_TRACE_DIR={ondemand} in its environment" in refused.stderr
        assert f"Choose a log file under {ondemand}/" in refused.stderr
        dots = await site.cli("alice", "gputrace", "--pids", str(ruled), "--log-file",
                              str(ondemand / "a..b.json"))  # fmt: skip
        assert dots.returncode == 2 and "it contains '..'" in dots.stderr
        for pid, path in ((ruled, ondemand / "t.json"), (plain, alice / "p.json")):
            r = await site.cli("alice", "gputrace", "--pids", str(pid), "--log-file", str(path),
                               "--iterations", "2", "--wait", "--timeout", "60")  # fmt: skip
            assert r.returncode == 0, r.stdout + r.stderr
        stops_in_time(site)


async def test_a_library_truncated_under_the_search_does_not_kill_the_agent(
    short_tmp: Path, run_mode: str
) -> None:
    """Found: the Kineto-rule lookup mapped the file a trainer maps as libkineto and searched
    it; the user truncating that file during the search killed the agent with SIGBUS (exit
    135, no log line) on the first try — after which she could bind @dynolog@ and answer
    other users' trainers. The file is now read in bounded chunks: the agent lives on."""
    async with served_site(short_tmp, mode=run_mode) as site:
        shrinking = await site.client("mallory", "shrink", str(site.socket_dir), "512", "8")
        assert isinstance(shrinking, dict) and shrinking["toggles"] > 100, shrinking
        assert site.agent.poll() is None, site.agent_log()[-3000:]
        pid = await trainer(site, "alice")
        await traced(site, "alice", pid)
        status = await site.cli("alice", "status")
        assert status.returncode == 0, status.stderr
        stops_in_time(site)


def test_a_user_holding_the_kineto_name_is_reported_as_an_attack() -> None:
    """Found: after killing the agent a user bound @dynolog@; the restarted agent ran
    without Kineto (a warning in its log) and her process answered other users' trainers.
    Now `status` and `doctor` name it as an attack, with her uid and pid, and the agent takes
    the name back once she lets go. (In a network namespace of its own: the name is global
    to one.)"""
    helper = Path(__file__).with_name("netns_impostor_run.py")
    with local_user() as mallory:
        r = subprocess.run(
            ["unshare", "--net", sys.executable, str(helper), str(mallory.uid), str(mallory.gid)],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert r.returncode == 0, r.stderr
        out = json.loads(r.stdout)
        held, freed = out["held"], out["freed"]
        who = f"pid {out['impostor_pid']} (python3) of uid {mallory.uid} ({mallory.name})"
        assert held["state"] == "unavailable", held
        assert held["reason"].startswith(
            f"ATTACK: the Kineto name @dynolog@ is held by {who}, not by this agent"
        ), held
        assert held["doctor"][0] is False and held["doctor"][1] == held["reason"]
        assert out["taken_back_after_s"] < 5, out
        assert freed["state"] == "ok", freed
        assert freed["doctor"][0] is True and "@dynolog@ held by pid" in freed["doctor"][1]


async def test_a_summary_reads_nothing_past_the_owners_rights(
    short_tmp: Path, run_mode: str
) -> None:
    """Found in round three, under the unit: its reads "as the owner" kept
    CAP_DAC_READ_SEARCH (setfsuid keeps it when the file-system uid was not 0), so a user
    who swapped the directory of her written trace for a link to a root-only directory got
    its 0600 file's contents back from GetTraceSummary. As root and as the unit, the read
    is now refused like it is for her."""
    secret = "ROOT-ONLY-SECRET-5e1d"
    async with served_site(short_tmp, mode=run_mode) as site:
        pid = await trainer(site, "alice")
        out = site.dirs["alice"] / "out"
        r = await site.run("alice", "mkdir", str(out))
        assert r.returncode == 0, r.stderr
        t = await trace(site, "alice", "--pids", str(pid), "--log-file", str(out / "t.json"),
                        "--iterations", "2", "--wait", "--timeout", "60")  # fmt: skip
        t_id = str(t["request"]["trace_id"])  # type: ignore[index]
        name = os.path.basename(t["trace"]["processes"][0]["output_path"])  # type: ignore[index]
        hidden = short_tmp / "root-only"
        hidden.mkdir(mode=0o700)
        doc = {"traceEvents": [
            {"ph": "X", "cat": "Trace", "name": "PyTorch Profiler (0)", "ts": 0, "dur": 10},
            {"ph": "X", "cat": "cpu_op", "name": secret, "pid": 1, "tid": 1, "ts": 0, "dur": 10},
        ]}  # fmt: skip
        (hidden / name).write_text(json.dumps(doc))
        os.chmod(hidden / name, 0o600)
        r = await site.run("alice", "sh", "-c", f"mv {out} {out}.real && ln -s {hidden} {out}")
        assert r.returncode == 0, r.stderr
        r = await site.cli("alice", "trace-summary", "--trace-id", t_id, "--json")
        assert secret not in r.stdout + r.stderr
        [row] = json.loads(r.stdout)["processes"]
        assert row["error"] == f"cannot read {out / name}: Permission denied", row
        stops_in_time(site)


async def test_legacy_port_with_the_new_limits(short_tmp: Path) -> None:
    """One user holds as many legacy-port connections as it may, trickling bytes so none is
    idle, opens more, and asks for another user's trainer and for a file Kineto would not
    write: each is refused naming its rule, and the other user's dyno request is served."""
    async with served_site(short_tmp) as site:
        pid = await trainer(site, "alice")
        port = str(site.legacy_port)
        # A request that announces 1000 bytes, then sends one every 0.5 s.
        announce = struct.pack("<i", 1000).hex()
        held = asyncio.create_task(site.client("mallory", "slow", port, "16", "30", announce))
        await asyncio.sleep(2)  # they are in
        steal = dyno_gputrace_bytes(str(site.dirs["mallory"] / "x.json"))
        reply = await site.client("mallory", "frame", port, steal.hex())
        assert isinstance(reply, dict)
        answer = unframe(bytes.fromhex(reply["reply"]))
        assert answer["rule"] == "peer_connection_limit", answer  # her 8 are all in use
        # Alice's dyno request is served meanwhile, and her trace is written.
        reply = await site.client(
            "alice", "frame", port,
            dyno_gputrace_bytes(str(site.dirs["alice"] / "d.json")).hex(),
        )  # fmt: skip
        answer = unframe(bytes.fromhex(reply["reply"]))  # type: ignore[index]
        assert answer["activityProfilersTriggered"] == [pid], answer
        done = await site.wait_done(str(answer["traceId"]))
        assert [p.state for p in done.processes] == [WRITTEN]
        slow = await held
        assert isinstance(slow, dict)
        ended = sorted(slow["ended_after_s"])
        # 8 held until the request deadline ([legacy_rpc] timeout_s = 5), 8 refused at once.
        assert len(ended) == 16 and all(e < 2 for e in ended[:8]), slow
        assert all(4 < e < 10 for e in ended[8:]), slow
        # Once they are gone, her request for another user's trainer is refused by rule.
        reply = await site.client("mallory", "frame", port, steal.hex())
        answer = unframe(bytes.fromhex(reply["reply"]))  # type: ignore[index]
        assert answer["rule"] == "not_process_owner", answer
        stops_in_time(site)
