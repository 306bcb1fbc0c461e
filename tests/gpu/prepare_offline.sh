#!/usr/bin/env bash
# Prepares DIR, on a Debian 12 machine with network, for running the GPU acceptance suite on
# a GPU node without network (run_offline.sh there). See tests/gpu/README.md.
#
#   tests/gpu/prepare_offline.sh DIR [PYTHON_VERSION]      (default PYTHON_VERSION: 3.12)
#
# DIR gets:
#   debs/     Debian's bcc and the libraries it links that GPU nodes often lack (apt-get
#             download: nothing is installed here)
#   wheels/   bpfdyno built from this checkout, its dependencies, pytest and pip, as wheels
#             for CPython PYTHON_VERSION on this machine's architecture
#   suite/    the suite itself (tests/gpu) with the project's pytest settings
#   run_offline.sh, MANIFEST (what was prepared, from which commit, for which Python)
# DIR is emptied first. Runs as any user that can use apt-get download (root not needed).
set -euo pipefail

DEBS=(libbpfcc python3-bpfcc libclang-cpp14 libllvm14 libz3-4 libicu72 libbpf1 bpftool libelf1
	libxml2 libedit2)
#: The suite's own files (tests/gpu without its CI-only tests).
SUITE_FILES=(README.md conftest.py gpu_suite.py trace_checks.py test_gpu_node.py test_nccl_plugin.py
	nccl_ranks.py cuda_load.py
	cuda_trainer.py preflight.py run_offline.sh prepare_offline.sh)
TEST_WHEELS=(pytest pytest-timeout pytest-asyncio pip)

die() {
	printf 'prepare_offline: error: %s\n' "$*" >&2
	exit 1
}

(($# >= 1 && $# <= 2)) || die "usage: $0 DIR [PYTHON_VERSION]"
[[ $1 != -* ]] || die "usage: $0 DIR [PYTHON_VERSION]"
PYV=${2:-3.12}
[[ $PYV =~ ^3\.[0-9]+$ ]] || die "PYTHON_VERSION must look like 3.12, not '$PYV'"
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
[[ -f $REPO/pyproject.toml ]] || die "run it from a bpfdyno checkout (no $REPO/pyproject.toml)"
PYTHON=${PYTHON:-$REPO/.venv/bin/python}
[[ -x $PYTHON ]] || PYTHON=python3
"$PYTHON" -m pip --version >/dev/null 2>&1 || die "$PYTHON has no pip: set PYTHON=/path/to/python3"
command -v apt-get >/dev/null || die "apt-get is needed (a Debian 12 machine: the debs are Debian 12's)"
MACHINE=$(uname -m)

mkdir -p "$1"
DIR=$(cd "$1" && pwd)
rm -rf -- "${DIR:?}"/{debs,wheels,suite,run,results} "$DIR/MANIFEST" "$DIR/run_offline.sh"
mkdir -p "$DIR"/{debs,wheels,suite/tests/gpu}
start=$SECONDS

echo "prepare_offline: Debian packages (${DEBS[*]})"
(cd "$DIR/debs" && apt-get -q -o APT::Sandbox::User=root download "${DEBS[@]}") >/dev/null ||
	die "apt-get download failed (run apt-get update first?)"

echo "prepare_offline: bpfdyno's wheel from $REPO"
"$PYTHON" -m pip wheel -q --no-deps -w "$DIR/wheels" "$REPO"
BPFDYNO_WHEEL=$(ls "$DIR"/wheels/bpfdyno-*.whl)

echo "prepare_offline: wheels for CPython $PYV on $MACHINE"
"$PYTHON" -m pip download -q --only-binary=:all: --python-version "$PYV" --implementation cp \
	--abi "cp${PYV/./}" --abi abi3 --abi none \
	--platform "manylinux_2_28_$MACHINE" --platform "manylinux_2_17_$MACHINE" \
	--platform "manylinux2014_$MACHINE" \
	-d "$DIR/wheels" "$BPFDYNO_WHEEL" "${TEST_WHEELS[@]}"

for f in "${SUITE_FILES[@]}"; do cp -p "$HERE/$f" "$DIR/suite/tests/gpu/"; done
cp -p "$REPO/pyproject.toml" "$DIR/suite/" # the pytest settings: markers, options
cp -p "$HERE/run_offline.sh" "$DIR/"

commit=$(git -C "$REPO" rev-parse HEAD 2>/dev/null || echo unknown)
git -C "$REPO" diff --quiet HEAD -- 2>/dev/null || commit="$commit+uncommitted"
cat >"$DIR/MANIFEST" <<EOF
python=$PYV
machine=$MACHINE
commit=$commit
bpfdyno_wheel=$(basename "$BPFDYNO_WHEEL")
prepared=$(date -u +%Y-%m-%dT%H:%M:%SZ) on $(hostname)
debs=$(ls "$DIR/debs" | wc -l) wheels=$(ls "$DIR/wheels" | wc -l)
EOF
echo "prepare_offline: $DIR ready in $((SECONDS - start)) s, $(du -sh "$DIR" | cut -f1):"
sed 's/^/  /' "$DIR/MANIFEST"
echo "on the GPU node, as root: $DIR/run_offline.sh $DIR"
