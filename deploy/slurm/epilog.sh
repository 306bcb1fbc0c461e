#!/usr/bin/env bash
# SLURM Epilog (slurm.conf: Epilog=/etc/slurm/bpfdyno-epilog.sh): stop an agent that
# prolog.sh started without systemd, once no other job runs on this node. An agent run by
# systemd (or a DaemonSet) is the node's and stays.
set -u

BPFDYNO_RUN=${BPFDYNO_RUN:-/run/bpfdyno}
# Jobs still on this node besides the one ending; squeue may be absent or slow: then keep it.
OTHER_JOBS=${OTHER_JOBS:-$(squeue -h -w "${SLURMD_NODENAME:-$(hostname -s)}" -o %A 2>/dev/null |
	grep -vx "${SLURM_JOB_ID:-}" | wc -l)}

pidfile=$BPFDYNO_RUN/prolog.pid
[[ -f $pidfile ]] || exit 0
[[ ${OTHER_JOBS:-1} == 0 ]] || exit 0
exec 9>"$BPFDYNO_RUN/prolog.lock"
flock -w 30 9 || exit 0
pid=$(cat "$pidfile")
# Only our agent: the pid must still be a `bpfdyno serve`.
if [[ -r /proc/$pid/cmdline ]] && tr '\0' ' ' <"/proc/$pid/cmdline" | grep -q 'bpfdyno serve'; then
	kill -TERM "$pid"
	for ((i = 0; i < 300; i++)); do
		kill -0 "$pid" 2>/dev/null || break
		sleep 0.1
	done
	kill -KILL "$pid" 2>/dev/null
fi
rm -f "$pidfile"
exit 0
