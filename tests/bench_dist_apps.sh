#!/usr/bin/env bash
# Runs bench_allreduce and bench_ddp on the CPU with 2 ranks and checks their JSON rows: every all-reduce
# result was correct and bus bandwidth = algorithm bandwidth * 2(N-1)/N; bench_ddp has the 'single' row
# plus one row per strategy (bucketed once per cap) and per ZeRO stage, none OOM, communication share within
# [0, 1], and each ZeRO stage holds its share of the state: optimizer state (1), gradients (2) and
# parameters (3) at most 60% of the single row's with 2 ranks. A bad bench_ddp flag, or ranks given different
# flags, end the job with one line from rank 0; bench_allreduce refuses to run as one process.
set -euo pipefail
mpiexec=$1
allreduce=$2
ddp=$3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
run() { "$mpiexec" -n 2 --oversubscribe --allow-run-as-root "$@"; }
run "$allreduce" --device cpu --sizes-mb 0.01,1 --warmup-iters 1 --steps 3 --json "$work/allreduce.jsonl" \
  >"$work/allreduce.md"
grep -q "| 1 | f32 | mpi | 2 |" "$work/allreduce.md"
run "$ddp" --device cpu --preset tiny --ctx 16 --batch 2 --precision f32 --bucket-mb 0.01,1000 \
  --zero 1,2,3 --warmup-iters 1 --steps 2 --json "$work/ddp.jsonl" >"$work/ddp.md"
grep -q "| tiny | single | - | 2 |" "$work/ddp.md"
# A bad flag: one line from rank 0 and a non-zero exit, not an abort per rank.
if run "$ddp" --device cpu --preset tiny --zero 7 >"$work/bad.log" 2>&1; then echo "bad flag: exit 0"; exit 1; fi
[ "$(grep -c "^error: --zero takes stages 0 to 3$" "$work/bad.log")" = 1 ] && ! grep -q "^rank [0-9]" "$work/bad.log" ||
  { echo "bad flag:"; cat "$work/bad.log"; exit 1; }
# Ranks started with different flags: one line naming the flag, before anything is measured (not a hang in a
# collective, or rank 0's settings printed over the others' rows).
c=(--device cpu --preset tiny --ctx 16 --precision f32 --warmup-iters 1 --steps 1)
if "$mpiexec" --oversubscribe --allow-run-as-root -n 1 "$ddp" "${c[@]}" --batch 1 : -n 1 "$ddp" "${c[@]}" --batch 2 \
  >"$work/bad.log" 2>&1; then
  echo "ranks with different --batch: exit 0"
  exit 1
fi
[ "$(grep -c "^error: ranks disagree on --batch: rank 0 has 1, rank 1 has 2$" "$work/bad.log")" = 1 ] &&
  ! grep -q "| tiny |" "$work/bad.log" || { echo "ranks with different --batch:"; cat "$work/bad.log"; exit 1; }
if "$mpiexec" --oversubscribe --allow-run-as-root -n 1 "$allreduce" --device cpu --steps 3 : -n 1 "$allreduce" \
  --device cpu --steps 5 >"$work/bad.log" 2>&1; then
  echo "bench_allreduce ranks with different --steps: exit 0"
  exit 1
fi
grep -q "^error: ranks disagree on --steps: rank 0 has 3, rank 1 has 5$" "$work/bad.log" ||
  { cat "$work/bad.log"; exit 1; }
# One rank has nothing to all-reduce with.
if "$allreduce" --device cpu >"$work/bad.log" 2>&1; then echo "bench_allreduce alone: exit 0"; exit 1; fi
grep -q "^error: bench_allreduce times an all-reduce between ranks" "$work/bad.log" || { cat "$work/bad.log"; exit 1; }
python3 - "$work/allreduce.jsonl" "$work/ddp.jsonl" <<'PY'
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
assert [r["size_mb"] for r in rows] == [0.01, 1], rows
for r in rows:
    assert r["correct"] and r["ranks"] == 2, r
    assert abs(r["busbw_gbps"] - r["algbw_gbps"] * 2 * (2 - 1) / 2) < 1e-6 * r["algbw_gbps"], r
rows = [json.loads(line) for line in open(sys.argv[2])]
assert [(r["strategy"], r["bucket_mb"]) for r in rows] == [
    ("single", None), ("naive", None), ("flat", None), ("overlap", None), ("bucketed", 0.01), ("bucketed", 1000),
    ("zero1", None), ("zero1+bucketed", 0.01), ("zero1+bucketed", 1000), ("zero2", None), ("zero3", None)
], rows
# Only DDP strategies measure the communication backward did not hide; the other rows say null, not 0.
ddp = {"naive", "flat", "overlap", "bucketed", "zero1+bucketed"}
for r in rows:
    assert not r["oom"] and r["step_ms"] > 0, r
    assert (0 <= r["comm_share"] <= 1) if r["strategy"] in ddp else r["comm_share"] is None, r
by = {r["strategy"]: r for r in rows}
single = by["single"]
for stage, keys in ((1, ["optimizer_state_bytes"]), (2, ["optimizer_state_bytes", "grad_bytes"]),
                    (3, ["optimizer_state_bytes", "grad_bytes", "param_bytes"])):
    r = by[f"zero{stage}"]
    assert r["zero_stage"] == stage, r
    for key in keys:
        assert 0 < r[key] <= 0.6 * single[key], (stage, key, r[key], single[key])
print("bench_allreduce and bench_ddp rows ok")
PY
