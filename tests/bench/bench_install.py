"""How big each way of installing bpfdyno is, and how long from a clean checkout to a running
agent: the Debian package, the container image, and the development set-up.

Run as a script, as root: ``python tests/bench/bench_install.py [--rounds 1] [--cold-pip]``.

Each round starts from a fresh ``git clone`` of this checkout's HEAD into a temporary
directory and times, per way, every step until the agent has said ``READY=1`` (package,
checkout) or answers ``bpfdyno status`` (image, as the DaemonSet's startup probe asks):

- package: ``deploy/debian/build.sh``, ``apt-get install ./bpfdyno_*.deb``, ``bpfdyno serve``
  to READY; then the package is purged;
- image: ``deploy/image/build.sh --deb`` (the package just built: a clean checkout builds it
  first either way), ``podman run`` of the agent with the DaemonSet's namespaces and
  capabilities, to the first answered ``status``; then the container and image are removed;
- checkout: ``vagrant/bootstrap.sh setup`` (no PyTorch: that is for the tests), then
  ``.venv/bin/bpfdyno serve`` to READY.

``--cold-pip`` runs pip without its cache (as on a fresh machine: every wheel downloaded).
Debian packages come from the machine's apt cache or the archive as apt sees fit. Printed:
per step the median over the rounds (seconds), and the sizes: the .deb, what it installs
under /opt/bpfdyno (bytecode included), the image and its archive. One machine, shared and
noisy: read the times as orders of magnitude, not to the second.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
AGENT_SETS = ["--set", 'legacy_rpc.listen=["127.0.0.1:0"]']


def timed(steps: dict[str, list[float]], name: str, action: Callable[[], object]) -> object:
    started = time.monotonic()
    result = action()
    steps.setdefault(name, []).append(time.monotonic() - started)
    return result


def run(*cmd: str | Path, env: dict[str, str] | None = None, cwd: Path | None = None) -> str:
    r = subprocess.run(
        [str(c) for c in cmd], capture_output=True, text=True, env=env, cwd=cwd, timeout=3600
    )
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(map(str, cmd))} failed:\n{r.stdout}{r.stderr}")
    return r.stdout


def serve_until_ready(command: list[str], scratch: Path) -> None:
    """Start ``command`` (a ``bpfdyno serve``) with a notify socket; stop it once READY=1."""
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    path = scratch / f"notify-{time.monotonic_ns()}"
    notify.bind(str(path))
    notify.settimeout(120)
    agent = subprocess.Popen(
        [*command, "--socket", str(scratch / "api.sock"), *AGENT_SETS],
        env={**os.environ, "NOTIFY_SOCKET": str(path)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        while b"READY=1" not in notify.recv(4096):
            pass
    finally:
        agent.terminate()
        agent.wait(30)
        notify.close()


def du(path: Path) -> int:
    return int(run("du", "-sb", path).split()[0])


def package_round(
    src: Path, out: Path, steps: dict[str, list[float]], sizes: dict[str, int]
) -> Path:
    build = src / "deploy/debian/build.sh"
    deb = Path(str(timed(steps, "package: build.sh", lambda: run(build, "--out", out).strip())))
    sizes["package .deb"] = deb.stat().st_size
    apt = ["apt-get", "-o", "DPkg::Lock::Timeout=300", "-y", "-q"]
    timed(steps, "package: apt-get install", lambda: run(*apt, "install", deb))
    sizes["package installed (/opt/bpfdyno)"] = du(Path("/opt/bpfdyno"))
    timed(steps, "package: serve to READY",
          lambda: serve_until_ready(["/usr/bin/bpfdyno", "serve"], out))  # fmt: skip
    run(*apt, "purge", "bpfdyno")
    return deb


def image_round(
    src: Path, deb: Path, out: Path, steps: dict[str, list[float]], sizes: dict[str, int]
) -> None:
    archive = Path(str(timed(steps, "image: build.sh", lambda: run(
        src / "deploy/image/build.sh", "--deb", deb, "--out", out).strip())))  # fmt: skip
    version = deb.name.split("_")[1]
    ref = f"localhost/bpfdyno:{version}"
    sizes["image (podman)"] = int(json.loads(run("podman", "image", "inspect", ref))[0]["Size"])
    sizes["image archive"] = archive.stat().st_size
    run_dir = out / "run"
    run_dir.mkdir()
    name = f"bench-{os.getpid()}"
    caps = "BPF,PERFMON,SYS_ADMIN,SYS_PTRACE,DAC_READ_SEARCH,SETUID,SETGID,SYS_RESOURCE"

    def start_and_probe() -> None:
        run("podman", "--runtime", "runc", "run", "--detach", "--pull=never", "--name", name,
            "--ulimit", "nofile=20000:20000", "--ulimit", "nproc=4096:4096",
            "--pid=host", "--network=host", "--cap-drop=all", f"--cap-add={caps}",
            "--security-opt=seccomp=unconfined", "--read-only", "--read-only-tmpfs=false",
            "--volume=/sys/kernel/btf:/sys/kernel/btf:ro",
            "--volume=/sys/kernel/tracing:/sys/kernel/tracing",
            f"--volume={run_dir}:/run/bpfdyno", "--tmpfs=/tmp", "--tmpfs=/var/cache/bpfdyno",
            ref, "serve", *AGENT_SETS)  # fmt: skip
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            r = subprocess.run(["podman", "exec", name, "bpfdyno", "status"], capture_output=True)
            if r.returncode == 0:
                return
            time.sleep(0.2)
        raise SystemExit("the agent in the container never answered status")

    try:
        timed(steps, "image: podman run to status", start_and_probe)
    finally:
        subprocess.run(["podman", "rm", "--force", name], capture_output=True)
        subprocess.run(["podman", "rmi", "--force", ref], capture_output=True)


def checkout_round(src: Path, out: Path, steps: dict[str, list[float]]) -> None:
    timed(steps, "checkout: bootstrap.sh setup", lambda: run(src / "vagrant/bootstrap.sh", "setup"))
    timed(steps, "checkout: serve to READY",
          lambda: serve_until_ready([str(src / ".venv/bin/bpfdyno"), "serve"], out))  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--cold-pip", action="store_true", help="pip without its cache")
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("run it as root: it installs the package and runs the image")
    if args.cold_pip:
        os.environ["PIP_NO_CACHE_DIR"] = "1"
    steps: dict[str, list[float]] = {}
    sizes: dict[str, int] = {}
    for i in range(args.rounds):
        with tempfile.TemporaryDirectory(prefix="bench-install-") as tmp:
            work = Path(tmp)
            os.chmod(work, 0o755)
            src = work / "bpfdyno"
            timed(steps, "git clone", lambda src=src: run("git", "clone", "-q", REPO, src))
            deb = package_round(src, work, steps, sizes)
            image_round(src, deb, work, steps, sizes)
            checkout_round(src, work, steps)
            shutil.rmtree(src / ".venv", ignore_errors=True)
        print(f"round {i + 1}/{args.rounds} done", file=sys.stderr)
    print(f"{'step':34} {'median s':>9}  rounds")
    for name, values in steps.items():
        print(f"{name:34} {statistics.median(values):9.1f}  {len(values)}")
    for way, first in (("package", "package: "), ("image", "image: "), ("checkout", "checkout: ")):
        total = sum(statistics.median(v) for k, v in steps.items() if k.startswith(first))
        if way == "image":  # a clean checkout builds the package first
            total += sum(statistics.median(v) for k, v in steps.items() if k == "package: build.sh")
        print(f"{'total: ' + way:34} {total:9.1f}")
    for name, size in sizes.items():
        print(f"{name:34} {size / 1e6:9.1f} MB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
