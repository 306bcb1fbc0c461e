#!/usr/bin/env bash
# SLURM Prolog (slurm.conf: Prolog=/etc/slurm/bpfdyno-prolog.sh): make sure this node's
# bpfdyno agent runs before a job starts, so `bpfdyno gputrace --job-id` reaches every rank.
#
# With the systemd unit installed this only starts it if it is down. Without systemd it
# starts `bpfdyno serve` in the background and records its pid in $BPFDYNO_RUN/prolog.pid,
# for epilog.sh.
#
# The command is $BPFDYNO_BIN when set, else `bpfdyno` on PATH, else the Debian package's
# /usr/bin/bpfdyno or /opt/bpfdyno/venv/bin/bpfdyno. When none of them runs, the prolog exits
# 1 with the reason (SLURM then drains the node with "Prolog error": a prolog installed without
# its agent is a broken node, and a silent one would leave every job on it untraceable). An
# agent that does not answer in time only makes the node untraceable: that is logged as an
# error and the job still starts.
set -u

find_bpfdyno() {
	local cand
	if [[ -n ${BPFDYNO_BIN:-} ]]; then
		[[ -x $BPFDYNO_BIN ]] && { echo "$BPFDYNO_BIN"; return 0; }
		return 1
	fi
	for cand in "$(command -v bpfdyno 2>/dev/null)" /usr/bin/bpfdyno /opt/bpfdyno/venv/bin/bpfdyno; do
		[[ -n $cand && -x $cand ]] && { echo "$cand"; return 0; }
	done
	return 1
}

BPFDYNO_RUN=${BPFDYNO_RUN:-/run/bpfdyno}
BPFDYNO_SOCKET=${BPFDYNO_SOCKET:-$BPFDYNO_RUN/bpfdyno.sock}
# Extra `bpfdyno serve` arguments for an agent started here (word-split on purpose).
BPFDYNO_SERVE_ARGS=${BPFDYNO_SERVE_ARGS:-}
READY_TIMEOUT_S=${READY_TIMEOUT_S:-60}

log() {
	# To the journal/syslog and to stderr (slurmd's log keeps a prolog's stderr).
	logger -t bpfdyno-prolog -- "job ${SLURM_JOB_ID:-?}: $*" 2>/dev/null
	echo "bpfdyno-prolog: job ${SLURM_JOB_ID:-?}: $*" >&2
}

if ! found=$(find_bpfdyno); then
	if [[ -n ${BPFDYNO_BIN:-} ]]; then
		log "error: BPFDYNO_BIN=$BPFDYNO_BIN is not an executable file: point it at the bpfdyno command (the Debian package installs /usr/bin/bpfdyno)"
	else
		log "error: no bpfdyno command found (not on PATH=$PATH, not /usr/bin/bpfdyno, not /opt/bpfdyno/venv/bin/bpfdyno): install the bpfdyno package, or set BPFDYNO_BIN in this prolog's environment"
	fi
	exit 1
fi
BPFDYNO_BIN=$found

up() { "$BPFDYNO_BIN" status --socket "$BPFDYNO_SOCKET" >/dev/null 2>&1; }

# The job's user gets her own Kineto socket directory (when the agent serves the per-user
# layout, [kineto] user_socket_root): `bpfdyno run` in the job then finds it made.
ready() {
	if [[ -n "${SLURM_JOB_UID:-}" ]]; then
		out=$("$BPFDYNO_BIN" kineto-dir --socket "$BPFDYNO_SOCKET" --uid "$SLURM_JOB_UID" 2>&1) ||
			[[ $out == *"user_socket_root is empty"* ]] ||
			log "no Kineto socket directory for uid $SLURM_JOB_UID: $out"
	fi
	exit 0
}

up && ready
if [[ -d /run/systemd/system ]] && systemctl cat bpfdyno.service >/dev/null 2>&1; then
	systemctl start bpfdyno.service || log "systemctl start bpfdyno failed"
else
	mkdir -p "$BPFDYNO_RUN"
	# One agent per node even if two jobs' prologs run at once.
	exec 9>"$BPFDYNO_RUN/prolog.lock"
	flock -w "$READY_TIMEOUT_S" 9 || { log "another prolog holds the lock"; exit 0; }
	up && ready
	# shellcheck disable=SC2086
	setsid "$BPFDYNO_BIN" serve --socket "$BPFDYNO_SOCKET" $BPFDYNO_SERVE_ARGS \
		</dev/null >>"$BPFDYNO_RUN/agent.log" 2>&1 9>&- &
	echo $! >"$BPFDYNO_RUN/prolog.pid"
fi
for ((i = 0; i < READY_TIMEOUT_S * 10; i++)); do
	up && ready
	sleep 0.1
done
log "error: the agent ($BPFDYNO_BIN) did not answer on $BPFDYNO_SOCKET within ${READY_TIMEOUT_S}s; this node is not traceable for this job: see $BPFDYNO_RUN/agent.log (or journalctl -u bpfdyno)"
exit 0
