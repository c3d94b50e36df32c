#!/usr/bin/env bash
# Starts a data-parallel job on this host: one rank per visible GPU (rank i drives GPU i), or --np ranks on
# the CPU when there is no GPU. Everything after the launcher's own options goes to the app, which is
# build/apps/train unless --app says otherwise.
#
#   launch/run_local.sh --preset small --data data/mine --out runs/ddp --steps 2000
#   launch/run_local.sh --np 2 --app bench_ddp --preset tiny --device cpu --strategy bucketed
set -euo pipefail

usage() {
  cat <<'USAGE'
usage: launch/run_local.sh [--np N] [--app APP] [--dry-run] [--] APP_ARGS...
  --np N      number of ranks (default: the GPUs that nvidia-smi -L lists, restricted to
              CUDA_VISIBLE_DEVICES when set; 1 without GPUs)
  --app APP   program to start: a path, or the name of an app in build/apps (default: train)
  --dry-run   print the mpirun command instead of running it
USAGE
}

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
app="$root/build/apps/train"
np=""
dry_run=0
# The value of option $1 (the next argument, $2), or a one-line error.
value_of() {
  [[ $# -ge 2 && "$2" != --* ]] || { echo "run_local.sh: $1 needs a value (see --launcher-help)" >&2; exit 2; }
  printf '%s' "$2"
}
while [[ $# -gt 0 ]]; do
  case "$1" in
    --np) np=$(value_of "$@"); shift 2
      [[ "$np" =~ ^[1-9][0-9]*$ ]] || { echo "run_local.sh: --np takes a positive number of ranks, got '$np'" >&2; exit 2; } ;;
    --app) app=$(value_of "$@"); shift 2
      # A bare name is one of the built apps (--app bench_ddp).
      [[ "$app" == */* ]] || app="$root/build/apps/$app" ;;
    --dry-run) dry_run=1; shift ;;
    -h|--launcher-help) usage; exit 0 ;;
    --) shift; break ;;
    *) break ;;
  esac
done

if [[ -z "$np" ]]; then
  gpus=0
  if command -v nvidia-smi >/dev/null 2>&1; then
    gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
  fi
  if [[ -n "${CUDA_VISIBLE_DEVICES:-}" && "$gpus" -gt 0 ]]; then
    IFS=',' read -r -a visible <<<"$CUDA_VISIBLE_DEVICES"
    gpus=${#visible[@]}
  fi
  np=$(( gpus > 0 ? gpus : 1 ))
fi
if [[ ! -x "$app" ]]; then
  if [[ "$app" == "$root/build/apps/"* ]]; then
    echo "run_local.sh: $app is not built (scripts/build.sh)" >&2
  else
    echo "run_local.sh: --app $app is not an executable file" >&2
  fi
  exit 1
fi

# NVLink multicast stays off: on shared machines it can take every GPU of the host out of service.
export NCCL_NVLS_ENABLE=0
launcher=(mpirun -np "$np" --bind-to none -x NCCL_NVLS_ENABLE)
# Forward the variables that matter when they are set (mpirun -x exports the current value).
for var in NCCL_DEBUG NCCL_DEBUG_SUBSYS NCCL_SOCKET_IFNAME NCCL_IB_HCA NCCL_IB_DISABLE NCCL_P2P_DISABLE \
           NCCL_ALGO NCCL_PROTO NCCL_MAX_CTAS CUDA_VISIBLE_DEVICES TT_NCCL_TIMEOUT_S TT_MPI_TIMEOUT_S \
           OMP_NUM_THREADS; do
  if [[ -n "${!var:-}" ]]; then launcher+=(-x "$var"); fi
done
# Open MPI refuses root unless told twice; containers often run as root.
if [[ $EUID -eq 0 ]]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  launcher+=(--allow-run-as-root)
fi
if [[ "$np" -gt "$(nproc)" ]]; then launcher+=(--oversubscribe); fi

if [[ $dry_run -eq 1 ]]; then
  printf '%q ' "${launcher[@]}" "$app" "$@"  # quoted as a shell would need it: copy and paste
  echo
  exit 0
fi
# Stopping: the first Ctrl-C (or SIGTERM, SIGHUP to this script) becomes SIGUSR2 to mpirun, which passes it
# to every rank (SIGUSR2 rather than SIGUSR1: Ubuntu 24.04's Open MPI 4.1.6 keeps SIGUSR1): `train`
# finishes its step, writes the checkpoint and exits 75 (the benchmarks end at once). A second one asks
# mpirun to end
# the job now (its own answer to SIGTERM: SIGTERM to the ranks, SIGKILL a second later). mpirun runs in a
# session of its own, so that the terminal's Ctrl-C reaches only this script, and a watcher ends the job if
# this script is killed outright.
pid=""
requests=0
stop() {
  requests=$((requests + 1))
  [[ -n "$pid" ]] || exit 130  # not started yet
  if [[ $requests -eq 1 ]]; then kill -USR2 "$pid" 2>/dev/null || true; else kill -TERM "$pid" 2>/dev/null || true; fi
}
trap stop INT TERM HUP
trap 'kill -USR2 "$pid" 2>/dev/null || true' USR1 USR2  # a scheduler's warning: always the graceful stop
if [[ -t 0 ]]; then
  launcher+=(--stdin none)  # the terminal stays this shell's
  setsid "${launcher[@]}" "$app" "$@" </dev/null &
else
  setsid "${launcher[@]}" "$app" "$@" <&0 &  # piped input still reaches rank 0
fi
pid=$!
script=$$
(while kill -0 "$script" 2>/dev/null; do sleep 1; done; kill -TERM "$pid" 2>/dev/null) &
watcher=$!
while true; do
  status=0
  wait "$pid" || status=$?
  kill -0 "$pid" 2>/dev/null || break  # still running: the wait was cut short by a trapped signal
done
kill "$watcher" 2>/dev/null || true
exit $status
