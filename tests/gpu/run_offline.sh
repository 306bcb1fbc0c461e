#!/usr/bin/env bash
# Runs the GPU acceptance suite on a GPU node without network, from a directory that
# prepare_offline.sh filled on a machine with network. See tests/gpu/README.md.
#
#   run_offline.sh [DIR] [--setup-only] [PYTEST ARGS...]   (DIR: default, this script's own)
#
# As root. Nothing is installed on the node: Debian's bcc is unpacked under DIR/run/root
# (dpkg -x), a virtualenv DIR/run/venv is made with --system-site-packages (so the node's own
# torch with CUDA stays importable) and the wheels are installed in it offline; the agent,
# the suite and the CUDA processes it starts find bcc through PYTHONPATH, its libraries
# through LD_LIBRARY_PATH and bpftool through PATH. Then a preflight starts the agent and
# checks its BPF programs load (a failure is reported, and the suite runs anyway), and
# `pytest -m gpu` runs the suite (a missing GPU is then a failure). --setup-only stops after
# the preflight (for a machine without a GPU).
# Results (pytest's output, the agent's log, the merged traces, report.json) go to
# DIR/results/<time>/. PYTHON=/path/to/python3 picks the interpreter whose torch has CUDA
# (default: python3); it must be the Python version the wheels were prepared for.
set -euo pipefail

die() {
	printf 'run_offline: error: %s\n' "$*" >&2
	exit 1
}
say() { printf 'run_offline: %s\n' "$*"; }

DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
if (($# >= 1)) && [[ $1 != -* ]]; then
	DIR=$(cd "$1" && pwd)
	shift
fi
SETUP_ONLY=0
if (($# >= 1)) && [[ $1 == --setup-only ]]; then
	SETUP_ONLY=1
	shift
fi
[[ -f $DIR/MANIFEST ]] || die "$DIR has no MANIFEST: prepare it with tests/gpu/prepare_offline.sh"
manifest() { sed -n "s/^$1=//p" "$DIR/MANIFEST"; }
t0=$(date +%s%N)
elapsed() {
	local tenths=$((($(date +%s%N) - t0) / 100000000))
	echo "$((tenths / 10)).$((tenths % 10)) s"
}

# -- what the node must have --------------------------------------------------------------
[[ $EUID -eq 0 ]] || die "run it as root: the agent loads BPF programs"
[[ $(uname -m) == "$(manifest machine)" ]] ||
	die "this node is $(uname -m), DIR was prepared for $(manifest machine)"
PYTHON=${PYTHON:-python3}
PYV=$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])') ||
	die "$PYTHON does not run: set PYTHON=/path/to/python3"
[[ $PYV == "$(manifest python)" ]] ||
	die "$PYTHON is Python $PYV but the wheels are for $(manifest python): set PYTHON, or prepare DIR for $PYV (prepare_offline.sh DIR $PYV)"
glibc=$(getconf GNU_LIBC_VERSION | awk '{print $2}')
[[ $(printf '%s\n' 2.36 "$glibc" | sort -V | head -1) == 2.36 ]] ||
	die "glibc $glibc is older than 2.36, which Debian 12's LLVM (bcc's compiler) needs; use the node's own bcc (python3-bpfcc) instead"
command -v dpkg >/dev/null || die "dpkg is needed to unpack the .deb files"

# bcc attaches tracepoints through tracefs, which a fresh boot may not have mounted.
if ! mountpoint -q /sys/kernel/tracing; then
	mount -t tracefs nodev /sys/kernel/tracing && say "mounted tracefs on /sys/kernel/tracing" ||
		say "warning: cannot mount tracefs; the preflight will say what it costs"
fi

RUN=$DIR/run
ROOT=$RUN/root
VENV=$RUN/venv
LIB=$ROOT/usr/lib/$(uname -m)-linux-gnu

# -- Debian's bcc, unpacked ----------------------------------------------------------------
if [[ ! -f $ROOT/.unpacked ]]; then
	rm -rf -- "$ROOT"
	mkdir -p "$ROOT"
	ls "$DIR"/debs/*.deb | xargs -P 8 -I{} dpkg -x {} "$ROOT"
	# Compiled once, quietly: Debian's bcc has regex strings newer Pythons warn about.
	"$PYTHON" -W ignore -m compileall -q "$ROOT/usr/lib/python3/dist-packages/bcc" >/dev/null
	touch "$ROOT/.unpacked"
fi
export LD_LIBRARY_PATH=$LIB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PYTHONPATH=$ROOT/usr/lib/python3/dist-packages${PYTHONPATH:+:$PYTHONPATH}
export PATH=$ROOT/usr/sbin:$ROOT/usr/bin:$PATH
missing=$(ldd "$LIB/libbcc.so.0" "$ROOT/usr/sbin/bpftool" | awk '/not found/ {print $1}' | sort -u)
[[ -z $missing ]] || die "libraries bcc needs are missing on this node: $(echo $missing)"
say "bcc unpacked ($(elapsed))"

# -- the virtualenv ------------------------------------------------------------------------
# Made again when made by another Python or at another path (DIR copied from elsewhere).
venv_stamp="$(command -v "$PYTHON" | xargs readlink -f) $VENV"
if [[ "$(cat "$VENV/.installed" 2>/dev/null)" != "$venv_stamp" ]]; then
	rm -rf -- "$VENV"
	# No pip in the venv (Debian's python3 may lack ensurepip): pip runs from its wheel.
	"$PYTHON" -m venv --without-pip --system-site-packages "$VENV"
	# The node's site-packages too, for a PYTHON that is itself a virtualenv's.
	site=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
	"$PYTHON" -c 'import site; print("\n".join(site.getsitepackages()))' >"$site/node-site.pth"
	pip_wheel=$(ls "$DIR"/wheels/pip-*.whl)
	"$VENV/bin/python" "$pip_wheel/pip" install -q --no-index --no-deps --no-compile \
		--disable-pip-version-check "$DIR"/wheels/*.whl
	echo "$venv_stamp" >"$VENV/.installed"
fi
say "virtualenv $VENV ready ($(elapsed))"
"$VENV/bin/python" -c 'import bcc, bpfdyno.version as v; print("run_offline: bpfdyno", v.__version__, "with bcc from", bcc.__file__)'
"$VENV/bin/python" -c 'import torch; print("run_offline: torch", torch.__version__, "CUDA", torch.version.cuda, "available:", torch.cuda.is_available())' 2>/dev/null ||
	say "torch does not import with $PYTHON: the suite's CUDA processes need it (set PYTHON)"

# -- preflight, then the suite -------------------------------------------------------------
RESULTS=$DIR/results/$(date +%Y%m%d-%H%M%S)
mkdir -p "$RESULTS"
SUITE=$DIR/suite
say "set-up done in $(elapsed); preflight:"
preflight=0
"$VENV/bin/python" "$SUITE/tests/gpu/preflight.py" "$RESULTS/preflight" || preflight=1
say "preflight done ($(elapsed))"
((SETUP_ONLY)) && exit "$preflight"
# A failed preflight does not stop the suite: what does not need BPF (NVML, GPM) still
# gives its values, and the rest says what failed.

cd "$SUITE"
set +e
BPFDYNO_GPU_REQUIRED=${BPFDYNO_GPU_REQUIRED-1} BPFDYNO_GPU_WORK_DIR=$RESULTS/suite \
	"$VENV/bin/pytest" -p no:cacheprovider -m gpu tests/gpu "$@" 2>&1 |
	tee "$RESULTS/pytest.log"
status=${PIPESTATUS[0]}
set -e
say "suite finished with status $status in $(elapsed); results in $RESULTS"
((preflight)) && say "the preflight FAILED: see $RESULTS/preflight/agent.log" && status=1
exit "$status"
