#!/usr/bin/env bash
# Checkpoints are safe to load and impossible to crash on: a full disk while writing exits 1 with one message
# and leaves the earlier checkpoints as they were; files changed with h5py (a dataset of another type, an
# attribute out of range, a newer format, an unknown precision, NaN weights, a flipped byte in a dataset's
# stored data) are refused by both `train --resume` and `train --eval-only`, each with a line naming the file
# and the object; a good checkpoint, and copies in the two earlier formats, still load and open in h5py.
# Usage: checkpoint_integrity.sh PATH/TO/train PATH/TO/prepare_data. Skipped (77) without Debian's python3-h5py.
set -uo pipefail
train=$1 prepare=$2
py=/usr/bin/python3
$py -c "import h5py, numpy" 2>/dev/null || { echo "python3-h5py missing: skipped"; exit 77; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failures=0
fail() { echo "FAIL $*"; failures=$((failures + 1)); }

# expect_error NAME "expected text" command...: a non-zero exit, the text, and no crash.
expect_error() {
  local name=$1 expected=$2
  shift 2
  local output status
  output=$("$@" 2>&1)
  status=$?
  if [ $status -eq 0 ] || [ $status -gt 128 ]; then
    fail "$name: exit code $status"; echo "$output" | tail -3; return
  fi
  if ! grep -q -- "$expected" <<<"$output"; then
    fail "$name: expected '$expected' in:"; echo "$output" | tail -3; return
  fi
  echo "ok   $name: $(grep -m1 'error' <<<"$output")"
}

expect_ok() {
  local name=$1
  shift
  if "$@" >"$work/last.log" 2>&1; then echo "ok   $name"; else
    fail "$name:"; tail -3 "$work/last.log"
  fi
}

# A small real corpus.
mkdir -p "$work/text"
for i in $(seq 1 300); do echo "Line $i of a small corpus: the quick brown fox jumps over the lazy dog."; echo "%"; done >"$work/text/a.txt"
"$prepare" --input "$work/text" --out "$work/data" --separator % >/dev/null || { echo "FAIL prepare_data"; exit 1; }
common=(--data "$work/data" --ctx 16 --batch 2 --eval-batches 1 --sample-tokens 0 --log-every 100 --device cpu)
eval_only=(--eval-only --data "$work/data" --ctx 16 --batch 2 --eval-batches 2)

expect_ok "train 4 steps" "$train" "${common[@]}" --out "$work/run" --steps 4 --ckpt-every 2
good="$work/run/checkpoints/step_4.h5"
[ -e "$good" ] || { echo "FAIL: no checkpoint to work on"; exit 1; }

# 1. A full disk (a file-size limit; train ignores SIGXFSZ) while writing step_6: exit 1 with one error line,
# no crash at exit, no temporary file, and the earlier checkpoints byte for byte as they were.
sums_before=$(md5sum "$work/run/checkpoints/"*.h5)
output=$(bash -c "ulimit -f 200; exec \"$train\" ${common[*]} --out $work/run --steps 6 --ckpt-every 2 --resume $good" 2>&1)
status=$?
if [ $status -ne 1 ]; then fail "disk full: exit code $status, expected 1"; echo "$output" | tail -3
elif ! grep -q "cannot write checkpoint $work/run/checkpoints/step_6.h5 (disk full?)" <<<"$output"; then
  fail "disk full: no 'cannot write checkpoint' line in:"; echo "$output" | tail -3
elif [ "$(grep -c 'error' <<<"$output")" -ne 1 ]; then fail "disk full: not exactly one error line:"; echo "$output" | tail -4
else echo "ok   disk full: $(grep -m1 'error' <<<"$output")"; fi
[ -e "$work/run/checkpoints/step_6.h5" ] && fail "disk full: a partial step_6.h5 exists"
ls "$work/run/checkpoints/"*.tmp >/dev/null 2>&1 && fail "disk full: a temporary file was left"
[ "$(md5sum "$work/run/checkpoints/"*.h5)" = "$sums_before" ] || fail "disk full: earlier checkpoints changed"

# 2. Files changed with h5py, each refused at load by --resume and by --eval-only.
# craft NAME PYTHON: a copy of the good checkpoint with PYTHON run on it as `f` (h5py, read-write).
craft() {
  cp "$good" "$work/$1.h5"
  $py - "$work/$1.h5" <<PY || fail "crafting $1"
import sys, zlib, h5py, numpy as np
with h5py.File(sys.argv[1], "r+") as f:
$2
PY
}
refused() {
  local name=$1 expected=$2
  expect_error "$name, --resume" "$expected" "$train" "${common[@]}" --out "$work/out_$name" --steps 6 --resume "$work/$name.h5"
  expect_error "$name, --eval-only" "$expected" "$train" "${eval_only[@]}" --resume "$work/$name.h5"
}

craft int32 '    w = f["model/lm_head.weight"][()]
    del f["model/lm_head.weight"]
    f["model/lm_head.weight"] = (w * 1000).astype(np.int32)'
refused int32 "checkpoint $work/int32.h5: dataset /model/lm_head.weight is int32, expected float32"

craft negative_step '    f["train"].attrs["step"] = np.int64(-5)'
refused negative_step "checkpoint $work/negative_step.h5: attribute /train@step is -5, expected >= 0"

craft newer '    f.attrs["format_version"] = np.int64(99)'
refused newer "checkpoint $work/newer.h5 was written by a newer version .*format_version 99"

craft fp8 '    f.attrs["precision"] = "fp8"'
refused fp8 "checkpoint $work/fp8.h5: attribute /@precision: unknown precision 'fp8'"

craft nan '    d = f["model/layers.0.attn.q_proj.weight"]
    w = d[()]
    w[3, 5] = np.nan
    d[...] = w
    d.attrs["crc32"] = np.int64(zlib.crc32(w.astype("<f4").tobytes()))  # written so, not damaged'
refused nan "checkpoint $work/nan.h5: dataset /model/layers.0.attn.q_proj.weight holds a non-finite value nan"

craft no_checksum '    del f["model/lm_head.weight"].attrs["crc32"]'
refused no_checksum "checkpoint $work/no_checksum.h5: dataset /model/lm_head.weight has no checksum"

# A byte in the middle of the stored data of a dataset (FILE DATASET; by default the embedding's).
flip_byte() { $py "$(dirname "$0")/flip_byte.py" "$1" "${2:-model/token_embeddings.weight}" || fail "flipping a byte in $1"; }
cp "$good" "$work/flipped.h5"
flip_byte "$work/flipped.h5"
cmp -s "$good" "$work/flipped.h5" && fail "flipped: the byte did not change"
refused flipped "checkpoint $work/flipped.h5 is damaged: checksum mismatch in /model/token_embeddings.weight"

# A run folder whose newest checkpoint has damaged optimizer state: --eval-only evaluates that one (its
# weights are whole, as when the file is named), while --resume latest passes over it.
mkdir -p "$work/optdamaged/checkpoints"
cp "$work/run/checkpoints/step_2.h5" "$good" "$work/optdamaged/checkpoints/"
flip_byte "$work/optdamaged/checkpoints/step_4.h5" optimizer/lm_head.weight/exp_avg
output=$("$train" "${eval_only[@]}" --resume "$work/optdamaged" 2>&1)
grep -q "^eval $work/optdamaged/checkpoints/step_4.h5: mean loss" <<<"$output" &&
  echo "ok   --eval-only on a folder: the newest checkpoint's whole weights evaluated" ||
  { fail "--eval-only on a folder with damaged optimizer state:"; echo "$output" | tail -3; }
output=$("$train" "${common[@]}" --out "$work/optdamaged" --steps 6 --resume latest 2>&1)
grep -q "resumed from $work/optdamaged/checkpoints/step_2.h5" <<<"$output" &&
  echo "ok   --resume latest passes over damaged optimizer state" ||
  { fail "--resume latest with damaged optimizer state:"; echo "$output" | tail -3; }

# 3. What must still load: the good checkpoint (resumed and evaluated; its layout as README.md's "Checkpoint
# format" shows it to h5py, each dataset's crc32 attribute equal to Python's zlib.crc32 of its bytes), a copy
# in format 2 (chunked, HDF5's Fletcher32 per chunk) and one in format 1 (contiguous, no checksums).
expect_ok "good checkpoint, --eval-only" "$train" "${eval_only[@]}" --resume "$good"
expect_ok "good checkpoint, --resume" "$train" "${common[@]}" --out "$work/out_good" --steps 6 --resume "$good"
$py - "$good" "$work/format1.h5" "$work/format2.h5" <<'PY' && echo "ok   h5py reads the checkpoint; its checksums are zlib's CRC-32; format 1 and 2 copies written" || fail "h5py"
import sys, zlib, h5py, numpy as np
with h5py.File(sys.argv[1], "r") as f:
    state_dict = {name: f["model"][name][()] for name in f["model"]}
    assert state_dict and all(v.dtype == np.float32 for v in state_dict.values())
    assert state_dict["lm_head.weight"].shape == (f.attrs["vocab_size"], f.attrs["d_model"])
    assert f.attrs["format_version"] == 3
    def check(name, obj):
        if isinstance(obj, h5py.Dataset) and obj.shape:
            assert obj.chunks is None and not obj.fletcher32, name
            expected = zlib.crc32(obj[()].astype("<f4").tobytes())
            assert obj.attrs["crc32"] == expected, f"{name}: crc32 {obj.attrs['crc32']} != {expected}"
    f.visititems(check)
    for path, version in ((sys.argv[2], 1), (sys.argv[3], 2)):
        with h5py.File(path, "w") as old:
            def copy(name, obj):
                if isinstance(obj, h5py.Dataset):  # no crc32 attribute
                    chunked = version == 2 and obj.shape
                    old.create_dataset(name, data=obj[()], chunks=True if chunked else None,
                                       fletcher32=bool(chunked))
                else:
                    for key, value in obj.attrs.items():
                        old.require_group(name).attrs[key] = value
            f.visititems(copy)
            for key, value in f.attrs.items():
                old.attrs[key] = value
            old.attrs["format_version"] = np.int64(version)
PY
for version in 1 2; do
  expect_ok "format $version checkpoint, --eval-only" "$train" "${eval_only[@]}" --resume "$work/format$version.h5"
  expect_ok "format $version checkpoint, --resume" "$train" "${common[@]}" --out "$work/out_format$version" --steps 6 \
    --resume "$work/format$version.h5"
done
# Format 2's own checksums still catch a flipped byte.
flip_byte "$work/format2.h5"
refused format2 "checkpoint $work/format2.h5 is damaged: checksum mismatch in /model/token_embeddings.weight"

echo "$failures failure(s)"
[ $failures -eq 0 ]
