#!/usr/bin/env bash
# A batch job whose ranks bpfdyno can trace on demand (sbatch deploy/slurm/job-example.sh):
#   bpfdyno gputrace --job-id <this job's id> --iterations 5 --log-file /shared/traces/t.json
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=2
#
# `bpfdyno run` sets KINETO_USE_DAEMON=1 and uses the node's agent (systemd, DaemonSet or
# prolog.sh); where there is none, the node's first task starts one for all its tasks and
# the last one stops it, so several tasks per node never clash and nothing outlives the step.
srun bpfdyno run -- python train.py
