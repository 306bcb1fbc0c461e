#!/usr/bin/env bash
# Provisions one node of the Vagrant dev cluster (run by the Vagrantfile after bootstrap.sh):
# the bpfdyno agent as the systemd service of deploy/systemd, and a SLURM cluster in which
# node1 runs slurmctld and every node slurmd, with deploy/slurm's prolog and epilog.
#
#   cluster.sh REPO NODE_NAME NODE_COUNT CPUS MEMORY_MB
set -euo pipefail

REPO=$1 NODE=$2 NODES=$3 CPUS=$4 MEMORY_MB=$5
log() { printf 'cluster: %s\n' "$*" >&2; }

log "bpfdyno as a systemd service"
install -m 0644 "$REPO/deploy/systemd/bpfdyno.service" /etc/systemd/system/bpfdyno.service
install -m 0644 "$REPO/deploy/systemd/bpfdyno.sysusers" /usr/lib/sysusers.d/bpfdyno.conf
install -m 0644 "$REPO/deploy/systemd/bpfdyno.tmpfiles" /usr/lib/tmpfiles.d/bpfdyno.conf
[[ -e /etc/bpfdyno/bpfdyno.toml ]] || install -m 0644 -D "$REPO/deploy/systemd/bpfdyno.toml" /etc/bpfdyno/bpfdyno.toml
# The unit runs /opt/bpfdyno/.venv/bin/bpfdyno: the checkout is there already.
ln -sf "$REPO/.venv/bin/bpfdyno" /usr/local/bin/bpfdyno
systemd-sysusers
systemd-tmpfiles --create /usr/lib/tmpfiles.d/bpfdyno.conf
usermod -aG bpfdyno vagrant
systemctl daemon-reload
systemctl enable --now bpfdyno.service

log "SLURM ($NODE of $NODES)"
export DEBIAN_FRONTEND=noninteractive
apt-get install -y -qq --no-install-recommends munge slurmd slurm-client >/dev/null
[[ $NODE == node1 ]] && apt-get install -y -qq --no-install-recommends slurmctld >/dev/null
install -m 0400 -o munge -g munge "$REPO/vagrant/.cluster/munge.key" /etc/munge/munge.key
systemctl restart munge

install -m 0755 "$REPO/deploy/slurm/prolog.sh" /etc/slurm/bpfdyno-prolog.sh
install -m 0755 "$REPO/deploy/slurm/epilog.sh" /etc/slurm/bpfdyno-epilog.sh
cat >/etc/slurm/slurm.conf <<CONF
ClusterName=bpfdyno-dev
SlurmctldHost=node1
AuthType=auth/munge
ProctrackType=proctrack/cgroup
TaskPlugin=task/none
SelectType=select/cons_tres
SchedulerType=sched/backfill
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmdSpoolDir=/var/lib/slurm/slurmd
StateSaveLocation=/var/lib/slurm/slurmctld
ReturnToService=2
Prolog=/etc/slurm/bpfdyno-prolog.sh
Epilog=/etc/slurm/bpfdyno-epilog.sh
NodeName=node[1-$NODES] CPUs=$CPUS RealMemory=$((MEMORY_MB - 512)) State=UNKNOWN
PartitionName=main Nodes=ALL Default=YES MaxTime=INFINITE State=UP
CONF
cat >/etc/slurm/cgroup.conf <<CONF
CgroupPlugin=autodetect
CONF
mkdir -p /var/lib/slurm/slurmd /var/lib/slurm/slurmctld
chown -R slurm:slurm /var/lib/slurm
if [[ $NODE == node1 ]]; then
	systemctl enable slurmctld
	systemctl restart slurmctld
fi
systemctl enable slurmd
systemctl restart slurmd
log "done: $(bpfdyno status --socket /run/bpfdyno/bpfdyno.sock 2>&1 | head -1)"
