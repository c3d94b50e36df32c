#!/usr/bin/env bash
# launch/slurm_train.sbatch on a one-node Slurm started here (munged, slurmctld and slurmd with their files
# in a scratch folder and ports of their own):
# - its two tasks train as one world through `srun --mpi=pmix`, with the losses of the same run under mpirun;
# - `scancel --batch --signal=USR1` (what Slurm sends before the time limit) stops it at a checkpoint (exit
#   75), the script requeues the job, and the job finishes from that checkpoint.
# Skipped (exit 77) without Slurm's daemons, or when not root (the daemons run as root here); CI installs
# them (.ci/run).
# Usage: slurm_launch.sh PATH/TO/train PATH/TO/prepare_data
set -uo pipefail
train=$1 prepare=$2
for command in munged slurmctld slurmd sbatch scontrol scancel sinfo mpirun; do
  command -v "$command" >/dev/null || { echo "skipped: no $command (a one-node Slurm: slurmctld slurmd slurm-client munge)"; exit 77; }
done
[ "$(id -u)" -eq 0 ] || { echo "skipped: the Slurm daemons of this test run as root"; exit 77; }
root=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d)
export SLURM_CONF=$work/slurm.conf OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
stop_all() {
  scancel --full --quiet --partition=tt 2>/dev/null
  for pid_file in slurmd.pid slurmctld.pid munged.pid; do
    [ -f "$work/$pid_file" ] && kill "$(cat "$work/$pid_file")" 2>/dev/null
  done
  sleep 1
  rm -rf "$work"
}
trap stop_all EXIT
failures=0
fail() { echo "FAIL $*"; failures=$((failures + 1)); }

# The cluster: this host as its one node, by address (no name lookup), every file under $work; at least two
# CPUs as configured (config_overrides), for the job's two tasks.
host=$(hostname -s)
port=$((20000 + RANDOM % 20000))
mkdir -p "$work/ctld" "$work/spool"
cat >"$SLURM_CONF" <<EOF
ClusterName=tinytrain-test
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$port
SlurmdPort=$((port + 1))
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
# cred_expire: also how long a requeued job waits before it starts again (default 120 s).
AuthInfo=socket=$work/munge.socket,cred_expire=10
CredType=cred/munge
MpiDefault=pmix
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SwitchType=switch/none
ReturnToService=2
StateSaveLocation=$work/ctld
SlurmdSpoolDir=$work/spool
SlurmctldPidFile=$work/slurmctld.pid
SlurmdPidFile=$work/slurmd.pid
SlurmctldLogFile=$work/slurmctld.log
SlurmdLogFile=$work/slurmd.log
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SlurmdParameters=config_overrides
NodeName=$host NodeAddr=127.0.0.1 CPUs=$(($(nproc) > 2 ? $(nproc) : 2)) RealMemory=1000 State=UNKNOWN
PartitionName=tt Nodes=$host Default=YES MaxTime=INFINITE State=UP
EOF
dd if=/dev/urandom of="$work/munge.key" bs=1024 count=1 2>/dev/null && chmod 600 "$work/munge.key"
munged --force --socket="$work/munge.socket" --key-file="$work/munge.key" --log-file="$work/munged.log" \
  --pid-file="$work/munged.pid" --seed-file="$work/munged.seed" || { echo "FAIL munged did not start"; exit 1; }
slurmctld -i || { echo "FAIL slurmctld did not start"; tail -5 "$work/slurmctld.log"; exit 1; }
slurmd || { echo "FAIL slurmd did not start"; tail -5 "$work/slurmd.log"; exit 1; }
for _ in $(seq 1 60); do [ "$(sinfo -h -o %T 2>/dev/null)" = idle ] && break; sleep 0.5; done
[ "$(sinfo -h -o %T 2>/dev/null)" = idle ] ||
  { echo "FAIL the node did not come up: $(sinfo -h 2>&1)"; tail -5 "$work/slurmctld.log" "$work/slurmd.log"; exit 1; }

mkdir -p "$work/text"
for i in $(seq 1 300); do echo "Line $i: a job under a scheduler keeps its work."; echo "%"; done >"$work/text/a.txt"
"$prepare" --input "$work/text" --out "$work/data" --separator % >/dev/null || { echo "FAIL prepare_data"; exit 1; }
args=(--data "$work/data" --device cpu --ctx 16 --batch 2 --eval-batches 1 --sample-tokens 0 --warmup 5)
# Two tasks on this node, no GPUs, minutes instead of the script's day; the app by its absolute path.
submit=(sbatch --parsable --nodes=1 --ntasks-per-node=2 --cpus-per-task=1 --gpus-per-node=0 --time=10
        --export="ALL,APP=$train")
state() { scontrol show job "$1" 2>/dev/null | grep -o 'JobState=[A-Z_]*' | cut -d= -f2; }

# 1. srun's two tasks are one world: the losses of the same run under mpirun, digit for digit.
cd "$root" || exit 1
job=$("${submit[@]}" --wait --output="$work/job_a.out" launch/slurm_train.sbatch "${args[@]}" --steps 6 \
  --log-every 1 --out "$work/run_slurm")
status=$?
mpirun -np 2 --oversubscribe "$train" "${args[@]}" --steps 6 --log-every 1 --out "$work/run_mpirun" >"$work/mpirun.log" 2>&1 ||
  { fail "mpirun -np 2 train:"; tail -3 "$work/mpirun.log"; }
losses() { grep -o '"loss": [0-9.e+-]*' "$1/metrics.jsonl"; }
if [ $status -ne 0 ]; then
  fail "job $job: sbatch --wait exit $status:"; tail -5 "$work/job_a.out"
elif ! grep -q "2 ranks" "$work/job_a.out"; then
  fail "job $job did not train as one world of 2 ranks:"; grep -m3 -E "rank|error" "$work/job_a.out"
elif [ "$(losses "$work/run_slurm")" != "$(losses "$work/run_mpirun")" ] || [ -z "$(losses "$work/run_slurm")" ]; then
  fail "srun's losses differ from mpirun's:"; paste <(losses "$work/run_slurm") <(losses "$work/run_mpirun") | head -6
else
  echo "ok   srun --mpi=pmix: 2 tasks, one world, mpirun's losses"
fi

# 2. Slurm's warning before the time limit: a checkpoint, exit 75, a requeue, and the job finishes from it.
steps=1500
job=$("${submit[@]}" --output="$work/job_b.out" launch/slurm_train.sbatch "${args[@]}" --steps $steps \
  --log-every 50 --ckpt-every 0 --out "$work/run_requeue" --resume latest)
for _ in $(seq 1 300); do grep -q '^step' "$work/job_b.out" 2>/dev/null && break; sleep 0.1; done
scancel --batch --signal=USR1 "$job"
for _ in $(seq 1 1000); do
  case "$(state "$job")" in
    COMPLETED) grep -q "^done: " "$work/job_b.out" && break ;;
    FAILED | CANCELLED | TIMEOUT) break ;;
  esac
  sleep 0.2
done
stopped=$(grep -o 'stopped: got SIGUSR2 after step [0-9]*' "$work/job_b.out" | head -1 | grep -o '[0-9]*$')
if [ -z "$stopped" ] || [ "$stopped" -ge $steps ]; then
  fail "job $job: no stop by the USR1 warning:"; tail -5 "$work/job_b.out"
elif ! grep -q "train stopped at a checkpoint (exit 75): requeueing job $job" "$work/job_b.out"; then
  fail "job $job stopped but did not requeue:"; tail -5 "$work/job_b.out"
elif ! grep -q "resumed from $work/run_requeue/checkpoints/step_$stopped.h5 at step $stopped" "$work/job_b.out"; then
  fail "job $job did not resume from step $stopped:"; tail -5 "$work/job_b.out"
elif [ "$(state "$job")" != COMPLETED ] || ! grep -q "^done: " "$work/job_b.out"; then
  fail "job $job did not finish after the requeue ($(state "$job")):"; tail -5 "$work/job_b.out"
else
  echo "ok   USR1 before the time limit: checkpoint at step $stopped, exit 75, requeued, finished from it"
fi
if [ $failures -gt 0 ]; then
  scontrol show job "$job" | grep -E "JobState|Restarts|BeginTime" | sed 's/^/     /'
  tail -5 "$work/slurmctld.log" | sed 's/^/     /'
  echo "$failures failure(s)"
  exit 1
fi
echo "all slurm_launch checks passed"
