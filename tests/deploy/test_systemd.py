"""deploy/systemd: the unit verifies, sysusers/tmpfiles create what it needs, its
capabilities suffice for the agent as an unprivileged user, the example config loads."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bpfdyno.core import config, config_example

REPO = Path(__file__).resolve().parents[2]
SYSTEMD = REPO / "deploy" / "systemd"
BPFDYNO = Path(sys.executable).with_name("bpfdyno")


def test_example_config_is_generated_from_the_schema_and_loads_to_the_defaults(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    example = SYSTEMD / "bpfdyno.toml"
    assert config_example.main(["--check", str(example)]) == 0, (
        "deploy/systemd/bpfdyno.toml is stale: python -m bpfdyno.core.config_example"
    )
    monkeypatch.delenv("KINETO_IPC_SOCKET_DIR", raising=False)
    loaded = config.load(example)
    assert loaded == config.Config()  # every key present, each at its default
    text = example.read_text()
    for section in ("daemon", "grpc", "export.prometheus", "export.otlp", "collectors.sched",
                    "sched", "net", "kineto", "tracing", "legacy_rpc"):  # fmt: skip
        assert f"\n[{section}]\n" in text, section
    # Every key is preceded by its comment.
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if re.match(r"^\w+ = ", line):
            assert lines[i - 1].startswith("#"), line


def test_a_changed_example_is_reported_stale(tmp_path: Path) -> None:
    stale = tmp_path / "bpfdyno.toml"
    stale.write_text((SYSTEMD / "bpfdyno.toml").read_text().replace("interval_s = 1.0", ""))
    assert config_example.main(["--check", str(stale)]) == 1


def test_the_unit_passes_systemd_analyze_verify(tmp_path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    assert analyze is not None, "systemd-analyze is missing: run vagrant/bootstrap.sh test"
    unit = tmp_path / "bpfdyno.service"
    # verify checks that ExecStart exists: point it at this checkout's bpfdyno.
    text = (SYSTEMD / "bpfdyno.service").read_text()
    assert "ExecStart=/opt/bpfdyno/.venv/bin/bpfdyno serve\n" in text
    unit.write_text(text.replace("/opt/bpfdyno/.venv/bin/bpfdyno", str(BPFDYNO)))
    r = subprocess.run([analyze, "verify", str(unit)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "bpfdyno.service" not in r.stderr, r.stderr  # no warning about the unit
    assert "Type=notify\n" in text and "Restart=on-failure\n" in text
    assert "User=bpfdyno\n" in text


def test_sysusers_and_tmpfiles_create_the_user_group_and_socket_dir(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "etc").mkdir(parents=True)
    for kind, name in (("sysusers.d", "bpfdyno.sysusers"), ("tmpfiles.d", "bpfdyno.tmpfiles")):
        (root / "usr/lib" / kind).mkdir(parents=True)
        shutil.copy(SYSTEMD / name, root / "usr/lib" / kind / "bpfdyno.conf")
    subprocess.run(["systemd-sysusers", f"--root={root}"], check=True, capture_output=True)
    passwd = {line.split(":")[0]: line.split(":") for line in (root / "etc/passwd").open()}
    group = {line.split(":")[0]: line.split(":") for line in (root / "etc/group").open()}
    uid, gid = int(passwd["bpfdyno"][2]), int(passwd["bpfdyno"][3])
    assert gid == int(group["bpfdyno"][2])
    # Socket access has a group of its own, with nobody in it yet: never the agent's.
    assert int(group["bpfdyno-users"][2]) != gid
    assert group["bpfdyno-users"][3].strip() == group["bpfdyno"][3].strip() == ""
    assert passwd["bpfdyno"][6].strip() == "/usr/sbin/nologin"
    subprocess.run(["systemd-tmpfiles", f"--root={root}", "--create"], check=True,
                   capture_output=True)  # fmt: skip
    st = (root / "run/bpfdyno").stat()
    # Every user may reach the socket inside.
    assert (st.st_uid, st.st_gid, st.st_mode & 0o7777) == (uid, gid, 0o755)


def _unit_capabilities() -> list[str]:
    text = (SYSTEMD / "bpfdyno.service").read_text()
    ambient = re.search(r"^AmbientCapabilities=(.*)$", text, re.MULTILINE)
    bounding = re.search(r"^CapabilityBoundingSet=(.*)$", text, re.MULTILINE)
    assert ambient is not None and bounding is not None
    assert ambient.group(1).split() == bounding.group(1).split()
    return [c.lower() for c in ambient.group(1).split()]


@pytest.mark.root
@pytest.mark.slow
def test_the_units_capabilities_suffice_without_root(tmp_path: Path) -> None:
    """The agent as nobody with only the unit's capabilities: BPF, perf and run stats work."""
    capsh = shutil.which("capsh")
    assert capsh is not None, "capsh is missing: run vagrant/bootstrap.sh test"
    caps = ",".join(_unit_capabilities())
    run = Path("/tmp") / f"bd-caps-{os.getpid()}"
    # Shared by the unprivileged agent and root's client: root's and sticky, as the agent
    # requires of a Kineto socket directory others may write.
    run.mkdir(mode=0o1777)
    os.chmod(run, 0o1777)
    log = tmp_path / "agent.log"
    sock = run / "a.sock"
    cmd = (
        f"exec {BPFDYNO} serve --socket {sock} --set legacy_rpc.enabled=false "
        f"--set kineto.socket_dir='\"{run}\"' --set collectors.gpu.enabled=false "
        f"--set collectors.dcgm.enabled=false"
    )
    with log.open("w") as out:
        agent = subprocess.Popen(
            [capsh, f"--caps={caps}+eip cap_setpcap,cap_setuid,cap_setgid+ep", "--keep=1",
             "--user=nobody", f"--addamb={caps}", "--", "-c", cmd],
            # Headers root's agents have not made yet go to the agent's own cache in TMPDIR.
            stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "TMPDIR": str(run)},
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        states: dict[str, str] = {}
        while time.monotonic() < deadline:
            assert agent.poll() is None, log.read_text()
            r = subprocess.run([str(BPFDYNO), "status", "--json", "--socket", str(sock)],
                               capture_output=True, text=True)  # fmt: skip
            if r.returncode == 0:
                import orjson

                status = orjson.loads(r.stdout)
                assert status["pid"] == agent.pid
                states = {c["name"]: c["state"] for c in status["collectors"]}
                if "COLLECTOR_STATE_STARTING" not in states.values():
                    break
            time.sleep(0.5)
        uid = int(Path(f"/proc/{agent.pid}/status").read_text().split("Uid:")[1].split()[0])
        assert uid == 65534  # nobody, not root
        for name in ("sched", "net", "perf_sw", "procs", "host", "kineto_ipc", "irq", "fabric"):
            assert states.get(name) == "COLLECTOR_STATE_OK", (name, states, log.read_text())
        assert "run statistics refused" not in log.read_text()
    finally:
        agent.terminate()
        agent.wait(timeout=30)
        shutil.rmtree(run, ignore_errors=True)


@pytest.mark.root
def test_the_agent_refuses_its_own_group_as_the_socket_group(tmp_path: Path) -> None:
    """Found: the docs told sites to add users to the agent's group for socket access, and
    under UMask=0007 that group could write the agent's files. The agent now refuses to
    serve with [grpc] socket_group naming its own group (exit 2, before it starts)."""
    sys.path.insert(0, str(REPO / "tests" / "tracing"))
    from local_user import local_user

    with local_user() as agent:
        os.chmod(tmp_path, 0o755)
        run_dir = tmp_path / "run"
        run_dir.mkdir()
        os.chown(run_dir, agent.uid, agent.gid)
        config = tmp_path / "bpfdyno.toml"
        config.write_text("")
        r = agent.run(
            [str(BPFDYNO), "serve", "--config", str(config), "--socket", str(run_dir / "s"),
             f'--set=grpc.socket_group="{agent.name}"', "--set=grpc.socket_mode=0o660"],
            timeout=60, unit=True,
        )  # fmt: skip
        assert r.returncode == 2, r.stderr
        assert (
            f"bpfdyno: config error: 'grpc.socket_group': names the agent's own group "
            f"({agent.name}): its members could change the agent's files"
        ) in r.stderr, r.stderr
        assert not (run_dir / "s").exists()
