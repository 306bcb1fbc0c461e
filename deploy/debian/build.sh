#!/usr/bin/env bash
# Builds the Debian package bpfdyno_<version>_<arch>.deb from this checkout, in one command:
#
#   deploy/debian/build.sh [--out DIR]        (default DIR: dist/ at the repository root)
#
# The package holds bpfdyno and its Python dependencies in a virtualenv under /opt/bpfdyno
# for Debian's python3, and depends on Debian's python3-bpfcc and bpftool; bpfdyno is on the
# PATH as /usr/bin/bpfdyno; the systemd unit, sysusers and tmpfiles entries and the commented
# example config (a conffile) come from deploy/systemd. See docs/deployment.md.
#
# What it does: copies the checkout's files (those git tracks, plus new ones it does not
# ignore) to a temporary directory, adds a debian/ directory made of deploy/debian and
# deploy/systemd, and runs dpkg-buildpackage there; the checkout itself is never written
# but for the result. Needs dpkg-dev, debhelper and python3-venv (installed when missing if
# run as root), and PyPI for the Python dependencies. Runs as any user.
set -euo pipefail

SCRIPT=$(readlink -f "${BASH_SOURCE[0]}")
HERE=$(dirname "$SCRIPT")
REPO_ROOT=$(dirname "$(dirname "$HERE")")
BUILD_DEPENDS=(dpkg-dev debhelper python3-venv)
# shellcheck source=deploy/apt.sh
source "$REPO_ROOT/deploy/apt.sh"

log() { printf 'build.sh: %s\n' "$*" >&2; }
die() {
	printf 'build.sh: error: %s\n' "$*" >&2
	exit 1
}

out=$REPO_ROOT/dist
while (($#)); do
	case $1 in
	--out)
		(($# >= 2)) || die "--out needs a directory"
		out=$2
		shift 2
		;;
	-h | --help)
		sed -n '2,4p' "$SCRIPT" | sed 's/^# \{0,1\}//'
		exit 0
		;;
	*) die "unknown argument '$1' (usage: deploy/debian/build.sh [--out DIR])" ;;
	esac
done

# The checkout's files: git's list when this is a git checkout, else the tree without the
# usual local artefacts.
copy_sources() {
	local dest=$1
	mkdir -p "$dest"
	if git -C "$REPO_ROOT" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
		(cd "$REPO_ROOT" && git ls-files -z --cached --others --exclude-standard |
			xargs -0 -r sh -c 'for f; do [ -e "$f" ] && printf "%s\0" "$f"; done' sh |
			tar --null -T - -cf -) | tar -xf - -C "$dest"
	else
		tar -C "$REPO_ROOT" --exclude=.git --exclude=.venv --exclude=build --exclude=dist \
			--exclude='*.egg-info' --exclude=__pycache__ --exclude='.*_cache' -cf - . |
			tar -xf - -C "$dest"
	fi
}

# The newest commit's time, so that two builds of one commit are alike; now without git.
source_date() {
	git -C "$REPO_ROOT" log -1 --format=%ct 2>/dev/null || date +%s
}

main() {
	command -v dpkg-query >/dev/null || die "not a Debian system (no dpkg-query)"
	ensure_packages "${BUILD_DEPENDS[@]}"
	local version src stamp deb
	version=$(sed -n 's/^__version__ = "\(.*\)"$/\1/p' "$REPO_ROOT/agent/bpfdyno/version.py")
	[[ -n $version ]] || die "no __version__ in agent/bpfdyno/version.py"
	work=$(mktemp -d) # global: the EXIT trap runs after main returns
	trap 'rm -rf -- "$work"' EXIT
	src=$work/bpfdyno-$version
	copy_sources "$src"

	# debian/: the packaging files, plus what deploy/systemd has for every install.
	mkdir "$src/debian"
	cp -a "$HERE"/. "$src/debian/"
	rm -f "$src/debian/build.sh"
	sed -e 's|^ExecStart=/opt/bpfdyno/\.venv/bin/bpfdyno |ExecStart=/usr/bin/bpfdyno |' \
		-e 's|^Documentation=file:/opt/bpfdyno/docs/|Documentation=file:/usr/share/doc/bpfdyno/|' \
		"$REPO_ROOT/deploy/systemd/bpfdyno.service" >"$src/debian/bpfdyno.service"
	grep -q '^ExecStart=/usr/bin/bpfdyno ' "$src/debian/bpfdyno.service" ||
		die "deploy/systemd/bpfdyno.service: ExecStart is not /opt/bpfdyno/.venv/bin/bpfdyno ...: update this script"
	cp "$REPO_ROOT/deploy/systemd/bpfdyno.sysusers" "$src/debian/bpfdyno.sysusers"
	cp "$REPO_ROOT/deploy/systemd/bpfdyno.tmpfiles" "$src/debian/bpfdyno.tmpfiles"
	stamp=$(source_date)
	cat >"$src/debian/changelog" <<EOF
bpfdyno ($version) unstable; urgency=medium

  * bpfdyno $version, built from its repository (see its git history).

 -- bpfdyno maintainers <maintainers@bpfdyno.invalid>  $(LC_ALL=C date -u -R -d "@$stamp")
EOF

	log "building bpfdyno $version in $src"
	(cd "$src" && SOURCE_DATE_EPOCH=$stamp dpkg-buildpackage -b -uc -us -j"$(nproc)" >"$work/build.log" 2>&1) || {
		tail -n 60 "$work/build.log" >&2
		die "dpkg-buildpackage failed (its last lines are above)"
	}
	deb=$(find "$work" -maxdepth 1 -name "bpfdyno_${version}_*.deb" -print -quit)
	[[ -n $deb ]] || die "dpkg-buildpackage made no bpfdyno_${version}_*.deb"
	mkdir -p "$out"
	cp "$deb" "$out/"
	printf '%s\n' "$(readlink -f "$out/$(basename "$deb")")"
}

main
