#!/usr/bin/env bash
# SLURM Prolog (slurm.conf: Prolog=/etc/slurm/bpfdyno-prolog.sh): make sure this node's
# bpfdyno agent runs before a job starts, so `bpfdyno gputrace --job-id` reaches every rank.
#
# With the systemd unit installed this only starts it if it is down. Without systemd it
# starts `bpfdyno serve` in the background and records its pid in $BPFDYNO_RUN/prolog.pid,
# for epilog.sh. It never fails the job: a node without an agent is only not traceable.
set -u

BPFDYNO_BIN=${BPFDYNO_BIN:-/opt/bpfdyno/.venv/bin/bpfdyno}
BPFDYNO_RUN=${BPFDYNO_RUN:-/run/bpfdyno}
BPFDYNO_SOCKET=${BPFDYNO_SOCKET:-$BPFDYNO_RUN/bpfdyno.sock}
# Extra `bpfdyno serve` arguments for an agent started here (word-split on purpose).
BPFDYNO_SERVE_ARGS=${BPFDYNO_SERVE_ARGS:-}
READY_TIMEOUT_S=${READY_TIMEOUT_S:-60}

log() { logger -t bpfdyno-prolog -- "job ${SLURM_JOB_ID:-?}: $*" 2>/dev/null || echo "bpfdyno-prolog: $*" >&2; }

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
log "the agent did not answer within ${READY_TIMEOUT_S}s; see $BPFDYNO_RUN/agent.log"
exit 0
