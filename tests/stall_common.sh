# Sourced by stalled_rank.sh and stalled_rank_gpu.sh (with $prepare set): a work folder holding a prepared
# corpus ($work/data), removed on exit with any rank still stopped, and the ranks' lookup.
work=$(mktemp -d)
victim=
# A stopped process outlives everything unless continued or killed.
trap '[ -n "$victim" ] && kill -9 "$victim" 2>/dev/null; rm -rf "$work"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mkdir -p "$work/text"
for i in $(seq 1 300); do echo "Sentence $i: how vexingly quick daft zebras jump."; echo "%"; done >"$work/text/a.txt"
"$prepare" --input "$work/text" --out "$work/data" --separator % >/dev/null || exit 1

# rank_pid LAUNCHER PROGRAM RANK: the process id of RANK among mpirun LAUNCHER's children running PROGRAM.
rank_pid() {
  local pid
  for pid in $(pgrep -P "$1" -f "$2"); do
    if tr '\0' '\n' <"/proc/$pid/environ" | grep -qx "OMPI_COMM_WORLD_RANK=$3"; then echo "$pid"; fi
  done
}
