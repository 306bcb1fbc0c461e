#!/usr/bin/env bash
# Builds the bpfdyno container image without any registry: a Debian root filesystem made by
# mmdebstrap from Debian's own archive, with the Debian package (deploy/debian) installed in
# it, imported into podman as bpfdyno:<version> and saved as an image archive.
#
#   deploy/image/build.sh [--deb FILE] [--out DIR] [--mirror URL]
#
#   --deb FILE    the package to install (default: build it with deploy/debian/build.sh)
#   --out DIR     where bpfdyno-image_<version>_<arch>.tar goes (default: dist/)
#   --mirror URL  the Debian archive (default: http://deb.debian.org/debian; its -security
#                 twin is derived from it)
#
# The image is Debian of this machine's release (the package's python3 is that release's)
# at its minimal variant, plus the package and what it depends on; no base image is pulled.
# The archive (docker-archive format) loads with `podman load`, `docker load` or
# `ctr -n k8s.io images import`; push it where the nodes pull from (deploy/kubernetes).
# Needs root, mmdebstrap and podman (installed when missing). See docs/deployment.md.
set -euo pipefail

SCRIPT=$(readlink -f "${BASH_SOURCE[0]}")
REPO_ROOT=$(dirname "$(dirname "$(dirname "$SCRIPT")")")
TOOLS=(mmdebstrap podman runc)
# shellcheck source=deploy/apt.sh
source "$REPO_ROOT/deploy/apt.sh"

log() { printf 'image/build.sh: %s\n' "$*" >&2; }
die() {
	printf 'image/build.sh: error: %s\n' "$*" >&2
	exit 1
}

deb=""
out=$REPO_ROOT/dist
mirror=http://deb.debian.org/debian
while (($#)); do
	case $1 in
	--deb | --out | --mirror)
		(($# >= 2)) || die "$1 needs a value"
		case $1 in
		--deb) deb=$(readlink -f "$2") ;;
		--out) out=$2 ;;
		--mirror) mirror=${2%/} ;;
		esac
		shift 2
		;;
	-h | --help)
		sed -n '6,11p' "$SCRIPT" | sed 's/^# \{0,1\}//'
		exit 0
		;;
	*) die "unknown argument '$1' (usage: deploy/image/build.sh [--deb FILE] [--out DIR] [--mirror URL])" ;;
	esac
done

((EUID == 0)) || die "run it as root (mmdebstrap builds the root filesystem as root, podman imports it)"

main() {
	ensure_packages "${TOOLS[@]}"
	local version arch suite stamp name rootfs archive
	version=$(sed -n 's/^__version__ = "\(.*\)"$/\1/p' "$REPO_ROOT/agent/bpfdyno/version.py")
	[[ -n $version ]] || die "no __version__ in agent/bpfdyno/version.py"
	arch=$(dpkg --print-architecture)
	# shellcheck source=/dev/null
	suite=$(. /etc/os-release && echo "${VERSION_CODENAME:-}")
	[[ -n $suite ]] || die "cannot tell this machine's Debian release (no VERSION_CODENAME in /etc/os-release)"
	work=$(mktemp -d) # global: the EXIT trap runs after main returns
	trap 'rm -rf -- "$work"' EXIT
	if [[ -z $deb ]]; then
		deb=$("$REPO_ROOT/deploy/debian/build.sh" --out "$work")
	fi
	[[ -f $deb && $(basename "$deb") == "bpfdyno_${version}_${arch}.deb" ]] ||
		die "$deb is not bpfdyno_${version}_${arch}.deb: build the package of this checkout"
	name=$(basename "$deb")
	stamp=$(git -C "$REPO_ROOT" log -1 --format=%ct 2>/dev/null || date +%s)
	rootfs=$work/rootfs.tar

	log "root filesystem: Debian $suite ($mirror) + $name"
	# minbase, /usr merged by mmdebstrap's hook (else apt pulls usrmerge and perl in), and
	# systemd-standalone-sysusers for the package's sysusers entry rather than all of
	# systemd; no manuals, translations or docs but the copyright files.
	SOURCE_DATE_EPOCH=$stamp mmdebstrap --variant=minbase --quiet \
		--hook-dir=/usr/share/mmdebstrap/hooks/merged-usr \
		--include=systemd-standalone-sysusers \
		--dpkgopt='path-exclude=/usr/share/man/*' \
		--dpkgopt='path-exclude=/usr/share/locale/*' \
		--dpkgopt='path-exclude=/usr/share/doc/*' \
		--dpkgopt='path-include=/usr/share/doc/*/copyright' \
		--customize-hook="copy-in '$deb' /tmp" \
		--customize-hook="chroot \"\$1\" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends '/tmp/$name'" \
		--customize-hook="rm \"\$1\"/tmp/'$name'" \
		"$suite" "$rootfs" \
		"deb $mirror $suite main" \
		"deb $mirror $suite-updates main" \
		"deb ${mirror}-security $suite-security main" >"$work/mmdebstrap.log" 2>&1 || {
		tail -n 40 "$work/mmdebstrap.log" >&2
		die "mmdebstrap failed (its last lines are above)"
	}

	log "importing bpfdyno:$version into podman"
	podman import --quiet \
		--change 'ENTRYPOINT ["/usr/bin/bpfdyno"]' \
		--change 'CMD ["serve"]' \
		--change "LABEL org.opencontainers.image.title=bpfdyno" \
		--change "LABEL org.opencontainers.image.version=$version" \
		"$rootfs" "localhost/bpfdyno:$version" >/dev/null
	mkdir -p "$out"
	archive=$out/bpfdyno-image_${version}_${arch}.tar
	rm -f -- "$archive"
	podman save --quiet --format docker-archive -o "$archive" "localhost/bpfdyno:$version"
	printf '%s\n' "$(readlink -f "$archive")"
}

main
