# shellcheck shell=bash
# Sourced by deploy/debian/build.sh and deploy/image/build.sh (which define log and die):
# the Debian packages a build needs, installed when missing if run as root.

ensure_packages() {
	local missing=() p
	for p in "$@"; do
		[[ "$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null)" == "install ok installed" ]] ||
			missing+=("$p")
	done
	((${#missing[@]} == 0)) && return
	((EUID == 0)) || die "missing build tools: apt-get install ${missing[*]} (as root), then run this again"
	log "apt-get install ${missing[*]}"
	DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 install -y -qq \
		--no-install-recommends "${missing[@]}" >/dev/null
}
