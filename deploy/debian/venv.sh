#!/usr/bin/env bash
# The package's virtualenv: bpfdyno and its Python dependencies, for Debian's own python3.
#
#   venv.sh DESTDIR PREFIX COPYRIGHT   build it at DESTDIR/PREFIX, ready to run from PREFIX;
#                                      list the distributions it holds at the end of COPYRIGHT
#   venv.sh --depends                  the python3 it needs: python3 (>= X.Y), python3 (<< X.Y+1)
#
# Run by debian/rules from the source tree (the current directory). The virtualenv is
# created at its staging path and made relocatable to PREFIX the way dh-virtualenv does it:
# the paths pip wrote (script shebangs, pyvenv.cfg) are rewritten, and the build fails if
# any staging path is left. No bytecode is shipped: the postinst compiles it in place.
# bcc is Debian's (python3-bpfcc), made importable exactly as vagrant/bootstrap.sh does for
# .venv: a .pth naming a directory that holds only a symlink to Debian's bcc package.
set -euo pipefail

PYTHON=/usr/bin/python3
BCC_DIR=/usr/lib/python3/dist-packages/bcc # python3-bpfcc's package directory

die() {
	printf 'venv.sh: error: %s\n' "$*" >&2
	exit 1
}

if [[ ${1:-} == --depends ]]; then
	"$PYTHON" -c 'import sys; v = sys.version_info
print(f"python3 (>= {v[0]}.{v[1]}), python3 (<< {v[0]}.{v[1] + 1})")'
	exit 0
fi
(($# == 3)) || die "usage: venv.sh DESTDIR PREFIX COPYRIGHT | --depends"
dest=$1
prefix=$2
copyright=$3
stage=$(readlink -m "$dest$prefix")
[[ -f pyproject.toml ]] || die "run from the source tree (no pyproject.toml in $PWD)"

rm -rf -- "$stage"
"$PYTHON" -m venv "$stage"
wheels=$(mktemp -d)
trap 'rm -rf -- "$wheels"' EXIT
# Build the wheel first and install it as a file, so pip records no link to this tree.
"$stage/bin/python" -m pip wheel -q --no-deps --wheel-dir "$wheels" .
"$stage/bin/python" -m pip install -q --no-compile --no-warn-script-location "$wheels"/bpfdyno-*.whl
# The virtualenv's own installers are not part of the product.
"$stage/bin/python" -m pip uninstall -q -y pip setuptools

site=$("$stage/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
"$stage/bin/python" - >>"$copyright" <<'EOF'
import importlib.metadata as md

for d in sorted(md.distributions(), key=lambda d: d.metadata["Name"].lower()):
    meta = d.metadata
    licence = meta.get("License-Expression") or ", ".join(
        c.split(" :: ")[-1] for c in meta.get_all("Classifier") or () if c.startswith("License ::")
    )
    if not licence:
        text = (meta.get("License") or "").strip()
        licence = text if text and "\n" not in text else "see its license files"
    print(f" {meta['Name']} {d.version}: {licence}")
EOF
mkdir "$stage/bcc-site"
ln -s "$BCC_DIR" "$stage/bcc-site/bcc"
printf '%s\n' "$prefix/bcc-site" >"$site/bcc-dist.pth"

# Only bpfdyno's own command (on the PATH as /usr/bin/bpfdyno) and the interpreter's links
# stay in bin/: no activate scripts, no other distribution's commands (pygmentize, ...).
find "$stage/bin" -type f ! -name bpfdyno -delete
# Modules are imported, never run: no executable bits (a few wheels set them).
find "$site" -type f ! -name '*.so' ! -name '*.so.*' -perm /111 -exec chmod a-x {} +
# Relocate. pip's direct_url.json names the temporary wheel.
for record in "$site"/bpfdyno-*.dist-info/RECORD; do
	sed -i '/\/direct_url\.json,/d' "$record"
done
rm -f -- "$site"/bpfdyno-*.dist-info/direct_url.json
grep -rlI --null -F -- "$stage" "$stage" | xargs -0 -r sed -i "s|$stage|$prefix|g"
find "$stage" -name __pycache__ -type d -prune -exec rm -rf {} +
if left=$(grep -rl -F -- "$stage" "$stage"); then
	die "the staging path is still written in: $left"
fi
