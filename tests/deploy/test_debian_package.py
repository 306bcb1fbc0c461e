"""deploy/debian: the package is built from this checkout, is lintian clean, installs on this
machine, runs as its unit runs it (user, capabilities, limits, READY=1), traces a real PyTorch
trainer, upgrades over itself, and leaves nothing behind when purged.

The lifecycle tests share one installation (the module's fixture installs the package and
purges it at the end); the last test removes and purges it itself and checks what is left.
"""

from __future__ import annotations

import json
import os
import pwd
import re
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import orjson
import pytest

import bpfdyno.version

#: The session's build runs in the first test's set-up: the package (pip downloads its
#: dependencies) takes minutes on a slow machine.
pytestmark = pytest.mark.timeout(1200)
REPO = Path(__file__).resolve().parents[2]
TRAINERS = REPO / "tests" / "tracing" / "trainers"
APT = ["apt-get", "-o", "DPkg::Lock::Timeout=300", "-y", "-q"]
#: What the package, the agent and its unit make outside the package's files (besides the
#: user and group bpfdyno): purge removes them.
MADE = ("/var/lib/bpfdyno", "/run/bpfdyno", "/var/cache/bpfdyno", "/var/log/bpfdyno")
#: The unit's directives this test does as systemd would; the rest must be known sandboxing.
EMULATED = {
    "Type", "NotifyAccess", "ExecStart", "User", "Group", "AmbientCapabilities",
    "CapabilityBoundingSet", "NoNewPrivileges", "SecureBits", "LimitMEMLOCK", "LimitNOFILE",
    "Nice", "UMask", "ConfigurationDirectory", "CacheDirectory", "LogsDirectory",
}  # fmt: skip
#: Directives systemd applies that a process started outside systemd cannot have: restart
#: policy, timeouts, cgroup bounds, namespaces and mount protections (docs/deployment.md).
NOT_EMULATED = {
    "Restart", "RestartSec", "RestartPreventExitStatus", "TimeoutStartSec", "TimeoutStopSec",
    "CPUQuota", "MemoryHigh", "MemoryMax", "TasksMax", "ReadWritePaths", "ProtectSystem",
    "ProtectHome", "ProtectClock", "ProtectHostname", "ProtectKernelModules",
    "RestrictRealtime", "RestrictSUIDSGID", "LockPersonality", "SystemCallArchitectures",
}  # fmt: skip


#: The package's command. A checkout's set-up links its own into /usr/local/bin, ahead on
#: PATH: these tests run the package's, always.
PACKAGED = "/usr/bin/bpfdyno"


def run(*cmd: str | Path, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    argv = [str(c) for c in cmd]
    if argv[0] == "bpfdyno":
        argv[0] = PACKAGED
    return subprocess.run(
        argv,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"},
    )


def installed_version() -> str:
    r = run("dpkg-query", "-W", "-f", "${Status} ${Version}", "bpfdyno")
    return r.stdout if r.returncode == 0 else ""


def user_exists(name: str) -> bool:
    try:
        pwd.getpwnam(name)
    except KeyError:
        return False
    return True


def test_metadata_and_files(debian_package: Path) -> None:
    version = bpfdyno.version.__version__
    arch = run("dpkg", "--print-architecture").stdout.strip()
    assert debian_package.name == f"bpfdyno_{version}_{arch}.deb"
    fields = {
        key: run("dpkg-deb", "-f", debian_package, key).stdout.strip()
        for key in ("Package", "Version", "Architecture", "Depends")
    }
    assert fields["Package"] == "bpfdyno"
    assert fields["Version"] == version
    depends = [d.strip() for d in fields["Depends"].split(",")]
    py = sys.version_info
    # iproute2: `ip` and `bridge` read the routes behind pod addresses (app/node_routes.py).
    for needed in ("python3-bpfcc", "bpftool", "iproute2", f"python3 (>= {py[0]}.{py[1]})",
                   f"python3 (<< {py[0]}.{py[1] + 1})",
                   "systemd | systemd-standalone-sysusers | systemd-sysusers"):  # fmt: skip
        assert needed in depends, fields["Depends"]
    listing = run("dpkg-deb", "-c", debian_package).stdout.splitlines()
    paths = {line.split()[5].removeprefix(".") for line in listing}
    for path in ("/opt/bpfdyno/venv/bin/bpfdyno", "/etc/bpfdyno/bpfdyno.toml",
                 "/lib/systemd/system/bpfdyno.service", "/usr/lib/sysusers.d/bpfdyno.conf",
                 "/usr/lib/tmpfiles.d/bpfdyno.conf", "/usr/share/man/man1/bpfdyno.1.gz",
                 "/usr/share/doc/bpfdyno/deployment.md",
                 "/usr/share/doc/bpfdyno/copyright"):  # fmt: skip
        assert path in paths, path
    links = {
        line.split()[5].removeprefix("."): line.split()[7] for line in listing if " -> " in line
    }
    assert links["/usr/bin/bpfdyno"] == "/opt/bpfdyno/venv/bin/bpfdyno"
    assert links["/opt/bpfdyno/venv/bcc-site/bcc"] == "/usr/lib/python3/dist-packages/bcc"
    # Nothing for the system's Python, no bytecode (the postinst compiles it in place).
    assert not [p for p in paths if re.match(r"/usr/(local/)?lib/python3", p)]
    assert not [p for p in paths if p.endswith(".pyc") or "__pycache__" in p]
    conffiles = run("sh", "-c", f"dpkg-deb --ctrl-tarfile {debian_package} | tar -xO ./conffiles")
    assert conffiles.stdout.split() == ["/etc/bpfdyno/bpfdyno.toml"]


def test_the_packaged_unit_sysusers_tmpfiles_and_config_are_deploys(debian_package: Path) -> None:
    """The package carries deploy/systemd's files; only the unit's paths differ."""

    def member(path: str) -> str:
        r = run("sh", "-c", f"dpkg-deb --fsys-tarfile {debian_package} | tar -xO .{path}")
        assert r.returncode == 0, r.stderr
        return r.stdout

    systemd = REPO / "deploy" / "systemd"
    unit = (systemd / "bpfdyno.service").read_text()
    assert member("/lib/systemd/system/bpfdyno.service") == unit.replace(
        "ExecStart=/opt/bpfdyno/.venv/bin/bpfdyno ", "ExecStart=/usr/bin/bpfdyno "
    ).replace("Documentation=file:/opt/bpfdyno/docs/", "Documentation=file:/usr/share/doc/bpfdyno/")
    assert member("/usr/lib/sysusers.d/bpfdyno.conf") == (systemd / "bpfdyno.sysusers").read_text()
    assert member("/usr/lib/tmpfiles.d/bpfdyno.conf") == (systemd / "bpfdyno.tmpfiles").read_text()
    assert member("/etc/bpfdyno/bpfdyno.toml") == (systemd / "bpfdyno.toml").read_text()


def test_lintian_is_clean_and_every_override_says_why(debian_package: Path) -> None:
    r = run("lintian", "--fail-on", "error,warning,info", debian_package, timeout=300)
    tags = [ln for ln in r.stdout.splitlines() if re.match(r"^[EWI]: ", ln)]
    assert (r.returncode, tags) == (0, []), r.stdout + r.stderr
    # Each override, or group of overrides, comes right after the comment that says why.
    reason = ""
    for line in (REPO / "deploy" / "debian" / "bpfdyno.lintian-overrides").read_text().splitlines():
        if line.startswith("#"):
            reason = line
        elif line:
            assert reason, f"override without its reason: {line}"
        else:
            reason = ""


@dataclass
class Installation:
    """The package installed on this machine, and what was there before."""

    deb: Path
    user_existed: bool


@pytest.fixture(scope="module")
def installation(debian_package: Path) -> Iterator[Installation]:
    assert not installed_version().startswith("install "), (
        "bpfdyno is already installed here: the test would replace it; purge it first"
    )
    existed = user_exists("bpfdyno")
    r = run(*APT, "install", debian_package)
    assert r.returncode == 0, r.stdout + r.stderr
    try:
        yield Installation(debian_package, existed)
    finally:
        if installed_version():
            run(*APT, "purge", "bpfdyno")


@pytest.mark.root
def test_installed_layout(installation: Installation) -> None:
    version = bpfdyno.version.__version__
    assert installed_version() == f"install ok installed {version}"
    # On the system's PATH (a checkout's set-up may add its own in /usr/local/bin, first).
    assert shutil.which("bpfdyno", path="/usr/sbin:/usr/bin:/sbin:/bin") == PACKAGED
    r = run("bpfdyno", "--version")
    assert (r.returncode, r.stdout) == (0, f"bpfdyno {version}\n")
    user = pwd.getpwnam("bpfdyno")
    assert (user.pw_dir, user.pw_shell) == ("/var/lib/bpfdyno", "/usr/sbin/nologin")
    st = os.stat("/run/bpfdyno")  # every user reaches the API socket (each acts as itself)
    assert (st.st_uid, st.st_gid, st.st_mode & 0o7777) == (user.pw_uid, user.pw_gid, 0o755)
    # The package's interpreter is Debian's python3; bcc is Debian's; bpfdyno is not visible
    # to the system's Python.
    probe = "import bcc, bpfdyno.version, sys; print(sys.prefix, bcc.__file__, sys.executable)"
    r = run("/opt/bpfdyno/venv/bin/python", "-c", probe)
    assert r.stdout.split() == [
        "/opt/bpfdyno/venv",
        "/opt/bpfdyno/venv/bcc-site/bcc/__init__.py",
        "/opt/bpfdyno/venv/bin/python",
    ], r.stderr
    assert Path("/opt/bpfdyno/venv/bin/python3").resolve() == Path("/usr/bin/python3").resolve()
    r = run("/usr/bin/python3", "-c", "import bpfdyno")
    assert "No module named 'bpfdyno'" in r.stderr
    # The postinst compiled the bytecode the unprivileged agent cannot write.
    cache = Path("/opt/bpfdyno/venv/lib")
    assert list(cache.glob("python3*/site-packages/bpfdyno/app/__pycache__/daemon.*.pyc"))


@pytest.mark.root
def test_doctor(installation: Installation) -> None:
    r = run("bpfdyno", "doctor")
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    for check in ("privileges", "bpf-syscall", "tracefs", "btf", "kernel-headers", "bcc"):
        assert any(ln.startswith(f"ok      {check}: ") for ln in lines), (check, r.stdout)
    assert "ok      bcc: bcc 0.26" in r.stdout
    assert "(/usr/lib/python3/dist-packages/bcc)" in r.stdout


def unit_directives(text: str) -> dict[str, str]:
    """The [Service] section's directives (each set once in the unit)."""
    service = text.split("[Service]", 1)[1].split("\n[", 1)[0]
    out: dict[str, str] = {}
    for line in service.splitlines():
        if line and not line.startswith("#"):
            key, value = line.split("=", 1)
            assert key not in out, f"{key} is set twice"
            out[key] = value
    return out


def _setpriv_caps(names: str) -> str:
    """CAP_BPF CAP_PERFMON -> +bpf,+perfmon."""
    return ",".join("+" + c.lower().removeprefix("cap_") for c in names.split())


def command_as_the_unit(unit: dict[str, str], extra: list[str]) -> list[str]:
    """ExecStart as systemd runs it: limits, nice, the user, its capabilities, the umask."""
    unknown = set(unit) - EMULATED - NOT_EMULATED
    assert not unknown, f"the unit has directives this test does not know: {sorted(unknown)}"
    assert (unit["Type"], unit["NotifyAccess"], unit["SecureBits"]) == (
        "notify",
        "main",
        "keep-caps",
    )
    assert unit["NoNewPrivileges"] == "yes"
    caps = _setpriv_caps(unit["AmbientCapabilities"])
    bounding = _setpriv_caps(unit["CapabilityBoundingSet"])
    return [
        "prlimit", f"--memlock={_limit(resource.RLIMIT_MEMLOCK, unit['LimitMEMLOCK'])}",
        f"--nofile={_limit(resource.RLIMIT_NOFILE, unit['LimitNOFILE'])}",
        "nice", "-n", unit["Nice"],
        "setpriv", f"--reuid={unit['User']}", f"--regid={unit['Group']}", "--init-groups",
        f"--inh-caps=-all,{caps}", f"--ambient-caps=-all,{caps}",
        f"--bounding-set=-all,{bounding}", "--no-new-privs", "--",
        "/bin/sh", "-c", f'umask {unit["UMask"]} && exec "$@"', "sh",
        *unit["ExecStart"].split(), *extra,
    ]  # fmt: skip


def _limit(which: int, setting: str) -> str:
    """The unit's limit (bytes or a count), as far as root may raise it here: these machines'
    root lacks CAP_SYS_RESOURCE, so a lower hard limit stays (8 MiB of locked memory, which
    kernels since 5.11 no longer charge BPF maps to; 20000 files)."""
    hard = resource.getrlimit(which)[1]
    wanted = resource.RLIM_INFINITY if setting == "infinity" else int(setting)
    if wanted == resource.RLIM_INFINITY:
        return "unlimited" if hard == resource.RLIM_INFINITY else str(hard)
    return str(wanted if hard == resource.RLIM_INFINITY else min(wanted, hard))


def make_unit_directories(unit: dict[str, str]) -> dict[str, str]:
    """What systemd does for the unit's *Directory= settings at each start: make them, give
    the cache and logs (and all in them, such as headers `bpfdyno doctor` generated as root)
    to the unit's user; and their environment variables."""
    user = pwd.getpwnam(unit["User"])
    env = {}
    for key, base, owned in (("ConfigurationDirectory", "/etc", False),
                             ("CacheDirectory", "/var/cache", True),
                             ("LogsDirectory", "/var/log", True)):  # fmt: skip
        path = Path(base) / unit[key]
        path.mkdir(mode=0o755, exist_ok=True)
        if owned:
            for p in (path, *path.rglob("*")):
                os.lchown(p, user.pw_uid, user.pw_gid)
        env[re.sub(r"(?<!^)([A-Z])", r"_\1", key).upper()] = str(path)
    return env


def capabilities(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"^CapEff:\s*([0-9a-f]+)$", status, re.M).group(1), 16)  # type: ignore[union-attr]


def capability_mask(names: str) -> int:
    numbers = {"cap_chown": 0, "cap_dac_read_search": 2, "cap_setgid": 6, "cap_setuid": 7,
               "cap_sys_ptrace": 19, "cap_sys_admin": 21, "cap_perfmon": 38,
               "cap_bpf": 39}  # fmt: skip
    return sum(1 << numbers[c.lower()] for c in names.split())


@pytest.mark.root
@pytest.mark.slow
def test_the_units_command_line_traces_a_trainer(installation: Installation) -> None:
    unit_path = next(
        p for p in run("dpkg", "-L", "bpfdyno").stdout.split() if p.endswith("/bpfdyno.service")
    )
    unit = unit_directives(Path(unit_path).read_text())
    # Private directories for what this test adds: the notify socket systemd would own, the
    # Kineto socket directory (root's and sticky, shared by the agent and the trainer), the
    # API socket in the unit's /run/bpfdyno and the trace's directory.
    scratch = Path(tempfile.mkdtemp(prefix="bd-deb-"))
    scratch.chmod(0o755)
    kineto = scratch / "kineto"
    kineto.mkdir()
    kineto.chmod(0o1777)
    traces = scratch / "traces"
    traces.mkdir()
    api = f"/run/bpfdyno/test-{os.getpid()}.sock"
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(str(scratch / "notify"))
    (scratch / "notify").chmod(0o666)
    notify.settimeout(120)
    env = {
        "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "LANG": "C.UTF-8",
        "HOME": "/var/lib/bpfdyno",
        "USER": "bpfdyno",
        "LOGNAME": "bpfdyno",
        "NOTIFY_SOCKET": str(scratch / "notify"),
        **make_unit_directories(unit),
    }
    # Only the endpoints differ from the unit's, so as not to take a node agent's places.
    extra = ["--socket", api, "--set", 'legacy_rpc.listen=["127.0.0.1:0"]',
             "--set", f'kineto.socket_dir="{kineto}"']  # fmt: skip
    log = scratch / "agent.log"
    trainer: subprocess.Popen[str] | None = None
    with log.open("w") as out:
        agent = subprocess.Popen(
            command_as_the_unit(unit, extra), stdout=out, stderr=subprocess.STDOUT, env=env
        )
    try:
        messages = b""
        while b"READY=1" not in messages:
            try:
                messages += notify.recv(4096) + b"\n"
            except TimeoutError:
                pytest.fail(f"no READY=1 in 120 s:\n{log.read_text()}")
        status_file = Path(f"/proc/{agent.pid}/status").read_text()
        uid = int(re.search(r"^Uid:\s*(\d+)", status_file, re.M).group(1))  # type: ignore[union-attr]
        assert uid == pwd.getpwnam("bpfdyno").pw_uid
        assert capabilities(agent.pid) == capability_mask(unit["AmbientCapabilities"])
        assert Path(f"/proc/{agent.pid}/exe").resolve() == Path("/usr/bin/python3").resolve()
        r = run("bpfdyno", "status", "--json", "--socket", api)
        assert r.returncode == 0, r.stderr
        states = {c["name"]: c["state"] for c in orjson.loads(r.stdout)["collectors"]}
        for name in ("host", "self", "sched", "net", "perf_sw", "procs", "kineto_ipc"):
            assert states.get(name) == "COLLECTOR_STATE_OK", (name, r.stdout, log.read_text())

        trainer = subprocess.Popen(
            [sys.executable, str(TRAINERS / "linear.py"), "--seconds", "300"],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env={
                **{k: v for k, v in os.environ.items() if not k.startswith("KINETO_")},
                "KINETO_USE_DAEMON": "1",
                "KINETO_IPC_SOCKET_DIR": str(kineto),
                "KINETO_CONFIG": str(TRAINERS / "kineto.conf"),
                "OMP_NUM_THREADS": "1",
            },
        )
        assert trainer.stdout is not None
        assert trainer.stdout.readline().startswith("ready ")
        out_file = traces / "t.json"
        r = run("bpfdyno", "gputrace", "--socket", api, "--pids", str(trainer.pid),
                "--iterations", "2", "--log-file", str(out_file), "--wait", "--timeout", "120",
                "--json", timeout=300)  # fmt: skip
        assert r.returncode == 0, r.stdout + r.stderr + log.read_text()
        (proc,) = orjson.loads(r.stdout)["trace"]["processes"]
        assert proc["state"] == "PROCESS_TRACE_STATE_WRITTEN", proc
        assert proc["kernel_tracks"]["state"] == "merged", proc
        assert {"net", "sched"} <= set(proc["kernel_tracks"]["merged"]), proc
        written = Path(proc["output_path"])
        assert written.parent == traces and written.stat().st_size == proc["size_bytes"]
        events = json.loads(written.read_text())["traceEvents"]
        assert [e["cat"] for e in events if e.get("cat") == "Trace" and e["ph"] == "X"] == ["Trace"]
        assert any(e.get("name", "").startswith("aten::") for e in events)  # PyTorch's ops
        kernel = {e["cat"] for e in events if e.get("cat", "").startswith("bpfdyno.")}
        assert "bpfdyno.info" in kernel and kernel & {"bpfdyno.sched", "bpfdyno.net"}, kernel
        assert written.stat().st_uid == 0  # the trainer's file, merged with root's rights

        agent.send_signal(signal.SIGTERM)
        assert agent.wait(timeout=int(unit["TimeoutStopSec"])) == 0, log.read_text()
        assert not Path(api).exists()
    finally:
        if trainer is not None:
            trainer.kill()
            trainer.wait()
        if agent.poll() is None:
            agent.kill()
            agent.wait()
        notify.close()
        shutil.rmtree(scratch, ignore_errors=True)


@pytest.mark.root
def test_upgrade_over_itself_keeps_the_operators_config(installation: Installation) -> None:
    conf = Path("/etc/bpfdyno/bpfdyno.toml")
    edited = conf.read_text().replace("\ninterval_s = 1.0\n", "\ninterval_s = 2.0\n", 1)
    conf.write_text(edited)
    uid = pwd.getpwnam("bpfdyno").pw_uid
    r = run(*APT, "-o", "Dpkg::Options::=--force-confold", "install", "--reinstall",
            installation.deb)  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    assert installed_version() == f"install ok installed {bpfdyno.version.__version__}"
    assert conf.read_text() == edited
    assert pwd.getpwnam("bpfdyno").pw_uid == uid
    r = run("bpfdyno", "--version")
    assert r.returncode == 0, r.stderr
    lib = Path("/opt/bpfdyno/venv/lib")
    assert list(lib.glob("python3*/site-packages/bpfdyno/app/__pycache__/daemon.*.pyc"))


#: The package's SLURM scripts, as dh_installexamples installs them.
EXAMPLES = Path("/usr/share/doc/bpfdyno/examples")
#: A prolog's environment under slurmd: the system's PATH only (no checkout on it).
SYSTEM_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"


def _serve_pids(socket_path: Path) -> list[int]:
    r = subprocess.run(["pgrep", "-f", f"serve --socket {socket_path}"],
                       capture_output=True, text=True)  # fmt: skip
    return [int(p) for p in r.stdout.split()]


@pytest.mark.root
@pytest.mark.slow
def test_the_packaged_prolog_and_epilog_under_a_real_slurmd(installation: Installation) -> None:
    """slurmd runs the package's own prolog and epilog (through a site wrapper that sets only
    where the agent lives): the prolog finds the installed command by itself, the job's step
    reaches the agent it started, and the epilog stops it after the job."""
    sys.path.insert(0, str(REPO / "tests" / "cluster"))
    from cluster_harness import SlurmCluster, wait_for

    base = Path(tempfile.mkdtemp(prefix="bds-", dir="/tmp"))
    base.chmod(0o755)
    run_dir = base / "run"
    socket_path = run_dir / "bpfdyno.sock"
    kineto = base / "kineto"
    kineto.mkdir()
    light = " ".join(
        f"--set=collectors.{c}.enabled=false"
        for c in ("sched", "net", "pmu", "perf_sw", "gpu", "dcgm", "procs", "irq")
    )
    wrappers = {}
    for script in ("prolog", "epilog"):
        w = base / f"site-{script}.sh"
        w.write_text(
            "#!/bin/bash\n"
            "# A site's wrapper: where the agent lives; the command is found by the script.\n"
            "unset BPFDYNO_BIN\n"
            f"export PATH={SYSTEM_PATH}\n"
            f"export BPFDYNO_RUN={run_dir}\n"
            f"export BPFDYNO_SERVE_ARGS='{light} --set=legacy_rpc.enabled=false "
            f'--set=kineto.socket_dir="{kineto}"\'\n'
            f"exec bash {EXAMPLES / (script + '.sh')}\n"
        )
        w.chmod(0o755)
        wrappers[script] = w
    cluster = SlurmCluster(
        base / "slurm",
        extra_conf=f"Prolog={wrappers['prolog']}\nEpilog={wrappers['epilog']}\n",
    )
    out = base / "job.out"
    try:
        cluster.start()
        # The job asks the agent the prolog started for its status, with the package's command.
        job = cluster.sbatch(
            "-N1", "-w", "n1", f"--output={out}",
            f"--wrap=/usr/bin/bpfdyno status --socket {socket_path} && sleep 2",
        )  # fmt: skip
        wait_for(lambda: not cluster.jobs(), 120, f"job {job} to end", step=0.2)
        text = out.read_text() if out.exists() else "(no output)"
        assert "agent up " in text, text
        # The prolog started the installed agent (Debian's interpreter, /usr/bin/bpfdyno)...
        log = (run_dir / "agent.log").read_text()
        assert "ready" in log.lower(), log
        # ...and the epilog stopped it once the job (the only one) ended.
        wait_for(lambda: not _serve_pids(socket_path), 60, "the epilog to stop the agent")
        assert not (run_dir / "prolog.pid").exists()
    finally:
        cluster.stop()
        for pid in _serve_pids(socket_path):
            os.kill(pid, signal.SIGKILL)
        shutil.rmtree(base, ignore_errors=True)


@pytest.mark.root
def test_the_packaged_prolog_fails_loudly_without_its_command(installation: Installation,
                                                             tmp_path: Path) -> None:  # fmt: skip
    """No command where the prolog looks: exit 1 at once (slurmd drains the node with "Prolog
    error") and a message that names where it looked and the fix, not a silent 60 s wait."""
    env = {"PATH": "/nonexistent", "BPFDYNO_RUN": str(tmp_path), "SLURM_JOB_ID": "7"}
    # Hide the package's commands for this run only: the prolog must find neither.
    hidden = [Path("/usr/bin/bpfdyno"), Path("/opt/bpfdyno/venv/bin/bpfdyno")]
    for path in hidden:
        path.rename(path.with_name(".bpfdyno.hidden-by-test"))
    try:
        r = subprocess.run(["/bin/bash", str(EXAMPLES / "prolog.sh")], env=env,
                           capture_output=True, text=True, timeout=30)  # fmt: skip
    finally:
        for path in hidden:
            path.with_name(".bpfdyno.hidden-by-test").rename(path)
    assert r.returncode == 1, (r.returncode, r.stderr)
    assert r.stderr == (
        "bpfdyno-prolog: job 7: error: no bpfdyno command found (not on PATH=/nonexistent, "
        "not /usr/bin/bpfdyno, not /opt/bpfdyno/venv/bin/bpfdyno): install the bpfdyno "
        "package, or set BPFDYNO_BIN in this prolog's environment\n"
    )
    r = subprocess.run(["/bin/bash", str(EXAMPLES / "prolog.sh")],
                       env={**env, "BPFDYNO_BIN": "/opt/nothing/bpfdyno"},
                       capture_output=True, text=True, timeout=30)  # fmt: skip
    assert r.returncode == 1
    assert "BPFDYNO_BIN=/opt/nothing/bpfdyno is not an executable file" in r.stderr


@pytest.mark.root
def test_remove_then_purge_leave_nothing(installation: Installation) -> None:
    r = run(*APT, "remove", "bpfdyno")
    assert r.returncode == 0, r.stdout + r.stderr
    assert installed_version() == f"deinstall ok config-files {bpfdyno.version.__version__}"
    for path in ("/opt/bpfdyno", "/usr/bin/bpfdyno", "/lib/systemd/system/bpfdyno.service"):
        assert not os.path.lexists(path), path
    assert Path("/etc/bpfdyno/bpfdyno.toml").exists()  # a conffile stays until purge
    assert user_exists("bpfdyno")
    # A file in each directory the agent and the unit make: other agents on this machine
    # (tests, a node agent) may make the directories again at any time, but not these files.
    markers = [Path(d) / f"purge-check-{os.getpid()}" for d in MADE]
    for marker in markers:
        marker.parent.mkdir(exist_ok=True)
        marker.touch()
    r = run(*APT, "purge", "bpfdyno")
    assert r.returncode == 0, r.stdout + r.stderr
    assert installed_version() == ""
    for path in ("/etc/bpfdyno", *markers,
                 "/etc/systemd/system/multi-user.target.wants/bpfdyno.service"):  # fmt: skip
        assert not os.path.lexists(path), path
    helper = Path("/var/lib/systemd/deb-systemd-helper-enabled")
    assert not list(helper.rglob("*bpfdyno*"))  # the unit's enablement state went too
    # The user and group go with the package that made them (an operator's own stay).
    assert user_exists("bpfdyno") is installation.user_existed
    # The per-user trace directories' parent keeps users' traces, owned by root from then.
    if not installation.user_existed and os.path.isdir("/tmp/bpfdyno"):
        st = os.stat("/tmp/bpfdyno")
        assert (st.st_uid, st.st_gid) == (0, 0)
