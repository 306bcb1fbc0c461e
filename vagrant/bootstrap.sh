#!/usr/bin/env bash
# Sets up everything bpfdyno needs on a fresh Debian 12 / Ubuntu machine, then runs an action.
#
#   vagrant/bootstrap.sh setup              set up only
#   vagrant/bootstrap.sh serve [ARGS...]    set up, then exec .venv/bin/bpfdyno serve ARGS
#   vagrant/bootstrap.sh test [PYTEST...]   set up (with PyTorch and SLURM), then the whole test suite
#
# Set-up: apt packages (python3-bpfcc, bpftool, perf, ...), a Python >= 3.11 virtualenv in
# .venv at the repository root with bcc made importable in it, the project installed editable
# with its test extras, `bpfdyno` on every user's PATH (/usr/local/bin/bpfdyno, a link into
# .venv), and tracefs mounted. The virtualenv is built on the system's /usr/bin/python3 (the
# interpreter bcc is built for, and one every user may run) when it is >= 3.11; one built on
# an interpreter other users cannot run (a pyenv build in root's home) is rebuilt. Every step
# checks first and does nothing when already done, so running it again is cheap. Runs as
# root (re-executes itself with sudo).
set -euo pipefail

SCRIPT=$(readlink -f "${BASH_SOURCE[0]}")
REPO_ROOT=$(dirname "$(dirname "$SCRIPT")")
VENV="$REPO_ROOT/.venv"
# Where the command goes for every user (a link to $VENV/bin/bpfdyno).
BIN_LINK=/usr/local/bin/bpfdyno
# pip work is skipped when this stamp matches the current pyproject.toml (see ensure_project).
STAMP="$VENV/.bpfdyno-bootstrap"
TORCH_REQUIREMENT="torch==2.13.0" # a bare "torch" pulls gigabytes of CUDA wheels
APT_PACKAGES=(python3-bpfcc bpftool linux-perf nftables iproute2 tmux gcc libc6-dev procps
	util-linux)
# Only for the test suite: a real Prometheus scrapes the exporter, `vagrant validate` checks
# the dev cluster, `systemd-analyze verify` the unit, capsh runs the agent with its
# capabilities, and a real SLURM cluster runs on this machine (tests/cluster; the tests start
# and stop its daemons themselves: no system service is enabled or used). The Debian package
# and the container image are built and run (deploy/debian, deploy/image): dpkg-dev, debhelper
# and python3-venv build it, lintian checks it, mmdebstrap makes the image's root filesystem
# and podman (with runc) runs it. ethtool reads NIC driver statistics beside the agent's own
# reader (tests/sources/fabric).
TEST_APT_PACKAGES=(prometheus vagrant systemd libcap2-bin slurmctld slurmd slurm-client munge
	dpkg-dev debhelper python3-venv lintian mmdebstrap podman runc ethtool)

log() { printf 'bootstrap: %s\n' "$*" >&2; }
die() {
	printf 'bootstrap: error: %s\n' "$*" >&2
	exit 1
}

usage() {
	cat >&2 <<EOF
usage: $0 setup | serve [BPFDYNO SERVE ARGS...] | test [PYTEST ARGS...]
  setup   install system packages, the virtualenv (.venv) and bpfdyno; mount tracefs
  serve   setup, then run the agent: .venv/bin/bpfdyno serve ARGS
  test    setup (plus PyTorch and SLURM), then the whole test suite (ruff and mypy included)
EOF
	exit 2
}

ensure_root() {
	[[ $EUID -eq 0 ]] && return
	command -v sudo >/dev/null || die "must run as root and sudo is not installed: run it as root"
	log "re-running as root with sudo"
	exec sudo -E -- "$SCRIPT" "$@"
}

APT_UPDATED=0
# Debian names; Ubuntu ships perf and bpftool in its linux-tools packages instead.
apt_names() {
	local id=""
	# shellcheck source=/dev/null
	[[ -r /etc/os-release ]] && id=$(. /etc/os-release && echo "${ID:-}")
	local p
	for p in "$@"; do
		if [[ $id == ubuntu && ($p == linux-perf || $p == bpftool) ]]; then
			echo linux-tools-common
			echo linux-tools-generic
		else
			echo "$p"
		fi
	done | sort -u
}

is_installed() {
	[[ "$(dpkg-query -W -f='${Status}' "$1" 2>/dev/null)" == "install ok installed" ]]
}

ensure_apt() {
	local missing=() p
	while read -r p; do
		is_installed "$p" || missing+=("$p")
	done < <(apt_names "$@")
	((${#missing[@]} == 0)) && return
	command -v apt-get >/dev/null || die "missing packages ${missing[*]} and no apt-get: install them by hand"
	export DEBIAN_FRONTEND=noninteractive
	if ((!APT_UPDATED)); then
		log "apt-get update"
		apt-get -o DPkg::Lock::Timeout=300 update -qq
		APT_UPDATED=1
	fi
	log "apt-get install ${missing[*]}"
	apt-get -o DPkg::Lock::Timeout=300 install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

python_ok() { "$1" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; }

# Prefer the system's Python (bcc is built for it, and every user may run it), then any
# python3.11 / python3 >= 3.11 on PATH (Ubuntu 22.04: deadsnakes or pyenv).
find_python() {
	local cand path
	for cand in /usr/bin/python3 python3.11 python3; do
		path=$(command -v "$cand" 2>/dev/null) || continue
		if python_ok "$path"; then
			# Resolve pyenv shims to the real interpreter, so the venv does not depend on them.
			"$path" -c 'import sys; print(sys.executable)'
			return
		fi
	done
	return 1
}

ensure_python() {
	PYTHON=$(find_python) || die "no Python >= 3.11 found (tried python3.11, python3): install one (Debian 12: apt-get install python3; Ubuntu 22.04: a python3.11 from deadsnakes or pyenv)"
	log "python: $PYTHON ($("$PYTHON" -c 'import platform; print(platform.python_version())'))"
	# Debian/Ubuntu split venv and ensurepip out of the system Python.
	if ! "$PYTHON" -c 'import ensurepip, venv' 2>/dev/null; then
		ensure_apt python3-venv
		"$PYTHON" -c 'import ensurepip, venv' 2>/dev/null ||
			die "$PYTHON cannot create virtualenvs: apt-get install python$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')-venv"
	fi
}

# Whether every user may run FILE: asked of the kernel as the user nobody (every directory on
# the way, through each link, must let others pass).
usable_by_all() {
	setpriv --reuid=65534 --regid=65534 --clear-groups -- test -x "$1" 2>/dev/null
}

ensure_venv() {
	if [[ -x $VENV/bin/python ]] && python_ok "$VENV/bin/python" &&
		"$VENV/bin/python" -m pip --version >/dev/null 2>&1; then
		if usable_by_all "$VENV/bin/python" || ! usable_by_all "$PYTHON"; then
			return
		fi
		log "$VENV runs on $(readlink -f -- "$VENV/bin/python"), which other users cannot run: rebuilding it on $PYTHON"
		rm -rf -- "$VENV"
	elif [[ -e $VENV ]]; then
		log "$VENV is unusable (interpreter gone or too old): recreating it"
		rm -rf -- "$VENV"
	fi
	log "creating virtualenv $VENV"
	"$PYTHON" -m venv "$VENV"
}

# A virtualenv (pyenv's in particular) never sees Debian's dist-packages, so bcc is exposed
# through a .pth naming a directory that holds nothing but a symlink to Debian's bcc package.
ensure_bcc_link() {
	local init bcc_dir site link_dir="$VENV/bcc-site"
	init=$(dpkg -L python3-bpfcc | grep -m1 -E '/bcc/__init__\.py$') ||
		die "python3-bpfcc ships no bcc/__init__.py: reinstall it (apt-get install --reinstall python3-bpfcc)"
	bcc_dir=$(dirname "$init")
	site=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
	if [[ "$(readlink "$link_dir/bcc" 2>/dev/null)" != "$bcc_dir" ||
		"$(ls -A "$link_dir" 2>/dev/null)" != bcc ]]; then
		log "linking bcc ($bcc_dir) into the virtualenv"
		rm -rf -- "$link_dir"
		mkdir -p "$link_dir"
		ln -s "$bcc_dir" "$link_dir/bcc"
	fi
	[[ "$(cat "$site/bcc-dist.pth" 2>/dev/null)" == "$link_dir" ]] ||
		printf '%s\n' "$link_dir" >"$site/bcc-dist.pth"
	"$VENV/bin/python" -c 'import bcc' ||
		die "bcc does not import in $VENV: check that libbpfcc is installed (apt-get install --reinstall python3-bpfcc)"
}

# Exit 0 when bpfdyno is installed editable from this checkout and every requirement of
# pyproject.toml (with the test extra) is satisfied in the venv; anything else means "install".
project_installed() {
	"$VENV/bin/python" - "$REPO_ROOT" <<'EOF' 2>/dev/null
import importlib.metadata as md
import importlib.util
import sys
import tomllib
from pathlib import Path

from packaging.requirements import Requirement

root = Path(sys.argv[1])
project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
spec = importlib.util.find_spec("bpfdyno.version")
if spec is None or spec.origin is None or Path(spec.origin).parent != root / "agent" / "bpfdyno":
    sys.exit(1)
for text in project["dependencies"] + project["optional-dependencies"]["test"]:
    req = Requirement(text)
    if req.marker is not None and not req.marker.evaluate():
        continue
    try:
        if not req.specifier.contains(md.version(req.name), prereleases=True):
            sys.exit(1)
    except md.PackageNotFoundError:
        sys.exit(1)
EOF
}

ensure_project() {
	local want
	want="$(sha256sum "$REPO_ROOT/pyproject.toml" | cut -d' ' -f1) $("$VENV/bin/python" -V)"
	if [[ "$(cat "$STAMP" 2>/dev/null)" == "$want" ]] && project_installed; then
		return
	fi
	log "pip install -e '.[test]' (a minute on a fresh machine)"
	rm -f -- "$STAMP"
	"$VENV/bin/python" -m pip install -q --progress-bar off -e "${REPO_ROOT}[test]"
	project_installed || die "bpfdyno is still not installed correctly in $VENV after pip install: see pip's output above"
	printf '%s\n' "$want" >"$STAMP"
}

ensure_torch() {
	if "$VENV/bin/python" -c 'import importlib.metadata as m, sys; sys.exit(not m.version("torch").startswith("2.13.0"))' 2>/dev/null; then
		return
	fi
	log "pip install $TORCH_REQUIREMENT"
	"$VENV/bin/python" -m pip install -q --progress-bar off "$TORCH_REQUIREMENT"
}

# `bpfdyno` for every user: a link in /usr/local/bin, unless a command of that name is there
# already that is not such a link (an installed package's stays first).
ensure_path_link() {
	local target="$VENV/bin/bpfdyno"
	if [[ -L $BIN_LINK ]]; then
		[[ "$(readlink -- "$BIN_LINK")" == "$target" ]] && return
		[[ "$(readlink -- "$BIN_LINK")" == */.venv/bin/bpfdyno ]] ||
			{ log "note: $BIN_LINK links elsewhere ($(readlink -- "$BIN_LINK")): left as it is"; return; }
	elif [[ -e $BIN_LINK ]]; then
		log "note: $BIN_LINK exists (an installed bpfdyno?): left as it is; this checkout's is $target"
		return
	fi
	mkdir -p -- "$(dirname -- "$BIN_LINK")"
	ln -sfn -- "$target" "$BIN_LINK"
	log "bpfdyno on every user's PATH: $BIN_LINK -> $target"
	usable_by_all "$target" ||
		log "note: other users cannot reach $target (a directory above it is private): move the checkout, or install the Debian package (deploy/debian)"
}

# bcc attaches tracepoints through tracefs, which a fresh boot does not mount.
ensure_mounts() {
	if ! mountpoint -q /sys/kernel/tracing; then
		log "mounting tracefs on /sys/kernel/tracing"
		mount -t tracefs nodev /sys/kernel/tracing ||
			log "warning: cannot mount tracefs; BPF tracepoints will be unavailable (bpfdyno doctor says more)"
	fi
	if [[ -d /sys/kernel/debug ]] && ! mountpoint -q /sys/kernel/debug; then
		mount -t debugfs nodev /sys/kernel/debug 2>/dev/null || log "note: debugfs not mounted (optional)"
	fi
}

setup() {
	local for_tests=$1
	# One set-up at a time per machine (provisioning and a manual run may overlap).
	mkdir -p /run/lock
	exec 9>/run/lock/bpfdyno-bootstrap.lock
	flock -w 900 9 || die "another bootstrap has held /run/lock/bpfdyno-bootstrap.lock for 15 minutes"
	ensure_apt "${APT_PACKAGES[@]}"
	ensure_python
	ensure_venv
	ensure_bcc_link
	ensure_project
	ensure_path_link
	if ((for_tests)); then
		ensure_apt "${TEST_APT_PACKAGES[@]}"
		ensure_torch
	fi
	ensure_mounts
	exec 9>&- # the lock must not leak into the agent or the test run
	log "set-up complete in ${SECONDS}s ($VENV)"
}

run_tests() {
	local rc=0
	cd "$REPO_ROOT"
	# ruff and mypy --strict run inside the suite (tests/test_static.py).
	log "pytest $*"
	# The pytest script, not "python -m pytest": that would put the repo root on sys.path and
	# make "import agent" work by accident.
	"$VENV/bin/pytest" "$@" || rc=$?
	if ((rc == 5)); then
		die "pytest ran no tests: that is a failure"
	elif ((rc != 0)); then
		die "tests failed (pytest exit $rc)"
	fi
	log "all tests passed"
}

main() {
	(($# >= 1)) || usage
	local action=$1
	shift
	case $action in
	setup | serve | test) ;;
	-h | --help | help) usage ;;
	*)
		log "unknown action '$action'"
		usage
		;;
	esac
	ensure_root "$action" "$@"
	case $action in
	setup) setup 0 ;;
	serve)
		setup 0
		exec "$VENV/bin/bpfdyno" serve "$@"
		;;
	test)
		setup 1
		run_tests "$@"
		;;
	esac
}

# Sourced (the tests call its functions one by one), it only defines them.
if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
	main "$@"
fi
