#!/usr/bin/env bash
# `export` and `import` against an independent reader: an exported Hugging Face Llama folder, parsed by
# tests/hf_export_check.py with NumPy alone, gives through a Llama forward in Hugging Face's convention the
# loss `train --eval-only` reports on the same windows (f32, single file and shards; bf16 is f32 rounded to
# nearest even); random Llama folders written by NumPy (F16, BF16, shards, other RoPE theta and RMSNorm
# epsilon) import into checkpoints that evaluate to their loss and that `train --resume` continues; export ->
# import -> export is byte-identical; damaged, truncated and mismatched folders, and what the model cannot
# represent, are refused in one line naming the file and the field, with nothing written.
# Usage: hf_export.sh export import train prepare_data. Skipped (77) without python3 and NumPy.
set -uo pipefail
export_app=$1 import_app=$2 train=$3 prepare=$4
py=/usr/bin/python3
check="$(dirname "$0")/hf_export_check.py"
$py -c "import numpy" 2>/dev/null || { echo "python3-numpy missing: skipped"; exit 77; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failures=0
fail() { echo "FAIL $*"; failures=$((failures + 1)); }

expect_ok() {
  local name=$1
  shift
  if "$@" >"$work/last.log" 2>&1; then echo "ok   $name"; else
    fail "$name:"; tail -5 "$work/last.log"
  fi
}

# expect_error NAME "expected text" command...: exit code 1, one line on stderr holding the text (fixed
# string), no crash.
expect_error() {
  local name=$1 expected=$2
  shift 2
  local status
  "$@" >"$work/out.log" 2>"$work/err.log"
  status=$?
  if [ $status -ne 1 ]; then fail "$name: exit code $status"; tail -3 "$work/err.log"; return; fi
  if [ "$(wc -l <"$work/err.log")" -ne 1 ]; then fail "$name: not one line:"; cat "$work/err.log"; return; fi
  if ! grep -qF -- "$expected" "$work/err.log"; then
    fail "$name: expected '$expected' in:"; cat "$work/err.log"; return
  fi
  echo "ok   $name: $(cat "$work/err.log")"
}

same_folders() {
  if diff -r "$1" "$2" >/dev/null; then echo "ok   $3: byte-identical"; else fail "$3: $1 and $2 differ"; fi
}

mkdir -p "$work/text"
for i in $(seq 1 300); do echo "Sphinx of black quartz, judge my vow number $i."; echo "%"; done >"$work/text/a.txt"
"$prepare" --input "$work/text" --out "$work/data" --separator % >/dev/null || { echo "FAIL prepare_data"; exit 1; }
windows=(--data "$work/data" --ctx 16 --batch 3 --eval-batches 2 --device cpu)
expect_ok "train 5 steps" "$train" --data "$work/data" --ctx 16 --batch 2 --steps 5 --eval-batches 1 \
  --sample-tokens 0 --device cpu --out "$work/run" --ckpt-every 5
ckpt="$work/run/checkpoints/step_5.h5"
[ -e "$ckpt" ] || { echo "FAIL: no checkpoint"; exit 1; }
expect_ok "eval-only" "$train" --eval-only --resume "$ckpt" "${windows[@]}" --json "$work/eval.json" \
  --logits "$work/logits.npy"

# 1. f32 export: the independent reader's Llama gives our loss; byte-level data has no HF tokenizer.
expect_ok "export f32" "$export_app" --checkpoint "$ckpt" --out "$work/hf"
for f in model.safetensors config.json README.md; do [ -f "$work/hf/$f" ] || fail "export: no $f"; done
[ -e "$work/hf/tokenizer.model" ] && fail "export: a tokenizer.model for byte-level data"
grep -q '"eos_token_id": 256' "$work/hf/config.json" || fail "export: config.json has no eos_token_id 256"
# No BOS in byte-level data: said as null, since transformers' LlamaConfig takes id 1 for a missing one.
grep -q '"bos_token_id": null' "$work/hf/config.json" || fail "export: config.json's bos_token_id is not null"
grep -q "no Hugging Face tokenizer" "$work/last.log" || fail "export: no note about the byte-level tokenizer"
# Byte tokens need nothing from the data folder (the checkpoint records them): moved away, the same export.
mv "$work/data" "$work/data_moved"
expect_ok "export f32, its byte-level data moved away" "$export_app" --checkpoint "$ckpt" --out "$work/hf_nodata"
mv "$work/data_moved" "$work/data"
same_folders "$work/hf" "$work/hf_nodata" "export with and without the byte-level data folder"
expect_ok "NumPy Llama loss == eval-only (f32)" $py "$check" loss "$work/hf" "$work/data/val.bin" 16 3 2 \
  "$work/eval.json"
expect_ok "NumPy Llama logits == eval-only --logits (f32)" $py "$check" logits "$work/hf" \
  "$work/data/val.bin" 16 "$work/logits.npy"
cat "$work/last.log"

# 2. import: the same loss, train --resume continues it, and a second export is the same bytes.
# Not as a run's step_N.h5, which would stand for step N (an import is weights at step 0).
cp "$ckpt" "$work/ckpt_before.h5"
expect_error "import over a run's checkpoint" "step_N.h5 is the name of a run's checkpoint of step N" \
  "$import_app" --from "$work/hf" --out "$ckpt" --overwrite
cmp -s "$ckpt" "$work/ckpt_before.h5" || fail "import over a run's checkpoint: the checkpoint changed"
expect_error "import as step_N.h5 in a folder" "step_N.h5 is the name of a run's checkpoint of step N" \
  "$import_app" --from "$work/hf" --out "$work/step_7.h5"
[ -e "$work/step_7.h5" ] && fail "import as step_N.h5 in a folder: wrote it"
expect_ok "import" "$import_app" --from "$work/hf" --out "$work/imported.h5" --data "$work/data"
expect_ok "eval-only of the import" "$train" --eval-only --resume "$work/imported.h5" "${windows[@]}" \
  --json "$work/eval2.json"
[ "$($py -c "import json,sys; print(json.load(open(sys.argv[1]))['loss'])" "$work/eval.json")" = \
  "$($py -c "import json,sys; print(json.load(open(sys.argv[1]))['loss'])" "$work/eval2.json")" ] ||
  fail "import: the loss differs from the original checkpoint's"
expect_ok "train --resume the import" "$train" --data "$work/data" --ctx 16 --batch 2 --steps 2 --eval-batches 1 \
  --sample-tokens 0 --device cpu --out "$work/run2" --resume "$work/imported.h5"
expect_ok "export the import (data found through the recorded flags)" "$export_app" \
  --checkpoint "$work/imported.h5" --out "$work/hf2"
same_folders "$work/hf" "$work/hf2" "export -> import -> export (f32)"

# 3. bf16: each value f32 rounded to nearest even; its round trip is the same bytes too.
expect_ok "export bf16" "$export_app" --checkpoint "$ckpt" --out "$work/hf_bf16" --dtype bf16
expect_ok "bf16 == f32 rounded" $py "$check" bf16 "$work/hf" "$work/hf_bf16"
expect_ok "import bf16" "$import_app" --from "$work/hf_bf16" --out "$work/imported_bf16.h5" --data "$work/data"
expect_ok "export the bf16 import" "$export_app" --checkpoint "$work/imported_bf16.h5" --out "$work/hf_bf16_2" \
  --dtype bf16
same_folders "$work/hf_bf16" "$work/hf_bf16_2" "export -> import -> export (bf16)"

# 4. Shards with an index; read back by the independent reader and imported to the same checkpoint.
expect_ok "export sharded" "$export_app" --checkpoint "$ckpt" --out "$work/hf_sharded" --shard-bytes 100000
[ -f "$work/hf_sharded/model.safetensors.index.json" ] && [ -f "$work/hf_sharded/model-00007-of-00007.safetensors" ] &&
  [ ! -e "$work/hf_sharded/model.safetensors" ] || fail "sharded export: not 7 shards and an index"
expect_ok "NumPy Llama loss == eval-only (shards)" $py "$check" loss "$work/hf_sharded" "$work/data/val.bin" 16 3 \
  2 "$work/eval.json"
expect_ok "import sharded" "$import_app" --from "$work/hf_sharded" --out "$work/imported_sharded.h5"
expect_ok "export the sharded import" "$export_app" --checkpoint "$work/imported_sharded.h5" --out "$work/hf3" \
  --data "$work/data"
same_folders "$work/hf" "$work/hf3" "sharded export -> import -> export"

# 5. Llama folders written by NumPy: F16 with RoPE theta 500000 and RMSNorm epsilon 0.25 (large enough that
# ignoring it would show), BF16 in three shards with three layers and the theta in rope_parameters (as
# transformers 5 writes it); and the F16 one exported again.
expect_ok "make F16 folder" $py "$check" make "$work/mk16" dtype=F16 theta=500000 eps=0.25
expect_ok "import F16" "$import_app" --from "$work/mk16" --out "$work/mk16.h5"
expect_ok "eval-only F16 import" "$train" --eval-only --resume "$work/mk16.h5" "${windows[@]}" --json "$work/mk16.json"
expect_ok "NumPy Llama loss == eval-only (F16, theta, eps)" $py "$check" loss "$work/mk16" "$work/data/val.bin" 16 \
  3 2 "$work/mk16.json"
cat "$work/last.log"
expect_ok "export the F16 import" "$export_app" --checkpoint "$work/mk16.h5" --out "$work/mk16_out" --data "$work/data"
grep -q '"rms_norm_eps": 0.25' "$work/mk16_out/config.json" && grep -q '"rope_theta": 500000.0' "$work/mk16_out/config.json" ||
  fail "export: rms_norm_eps or rope_theta not carried over"
expect_ok "NumPy Llama loss == eval-only (its export)" $py "$check" loss "$work/mk16_out" "$work/data/val.bin" 16 3 \
  2 "$work/mk16.json"
expect_ok "make BF16 shards" $py "$check" make "$work/mkbf" dtype=BF16 theta=20000 eps=1e-6 layers=3 shards=3 seed=4 \
  rope=parameters
expect_ok "import BF16 shards" "$import_app" --from "$work/mkbf" --out "$work/mkbf.h5"
expect_ok "eval-only BF16 import" "$train" --eval-only --resume "$work/mkbf.h5" "${windows[@]}" --json "$work/mkbf.json"
expect_ok "NumPy Llama loss == eval-only (BF16 shards)" $py "$check" loss "$work/mkbf" "$work/data/val.bin" 16 3 2 \
  "$work/mkbf.json"

# 6. Refusals on import: one line naming the file and the field; no checkpoint and no temporary left.
cases=(
  "short_file|shorter than the 8-byte header length"
  "header_past_end|is truncated: its header length is 50000000 bytes"
  "header_json|model.safetensors: the header is not valid JSON"
  "header_byte|last read: '{<0xFF>'"
  "offsets_past_end|model.layers.1.mlp.down_proj.weight has data_offsets"
  "offsets_mismatch|tensor model.norm.weight: data_offsets [492800,493056] hold 256 bytes, but F32 [128] needs 512"
  "truncated_data|past the end of the data (558748 bytes): the file is truncated"
  "missing_tensor|tensor model.layers.1.mlp.up_proj.weight is missing"
  "wrong_shape|tensor model.layers.0.mlp.down_proj.weight has shape [192, 64], config.json implies [64, 192]"
  "wrong_dtype|tensor model.layers.0.self_attn.v_proj.weight is I32, expected F32, BF16 or F16"
  "extra_tensor|tensor model.layers.0.self_attn.q_proj.bias is not part of the Llama model"
  "non_finite|holds a non-finite value"
  "no_weights|holds neither model.safetensors nor model.safetensors.index.json"
  "config_json|config.json: not valid JSON"
  "config_missing|config.json: hidden_size is missing"
  "config_type|config.json: num_hidden_layers must be a positive integer, got \"2\""
  "config_sizes|has shape [192, 64], config.json implies [384, 64]"
  "config_gqa|config.json: num_key_value_heads 2 differs from num_attention_heads 4: grouped-query attention"
  "config_tied|config.json: tie_word_embeddings is true"
  "config_bias|config.json: attention_bias is true"
  "config_scaling|config.json: rope_scaling has type \"linear\": scaled RoPE cannot be represented"
  "config_rope_parameters|config.json: rope_parameters has rope_type \"yarn\": scaled RoPE"
  "config_rope_conflict|config.json: rope_parameters.rope_theta 500000.0 differs from rope_theta 10000.0"
  "config_model_type|config.json: model_type is 'gpt2', expected llama"
  "config_architecture|config.json: architectures is [\"GPT2LMHeadModel\"]: only LlamaForCausalLM is read"
  "config_partial_rope|config.json: partial_rotary_factor is 0.5: RoPE on part of each head"
  "config_heads|config.json: hidden_size 64 is not divisible by num_attention_heads 3"
)
for entry in "${cases[@]}"; do
  case_name=${entry%%|*} expected=${entry#*|}
  $py "$check" break "$work/hf" "$work/bad" "$case_name" || { fail "break $case_name"; continue; }
  expect_error "import $case_name" "$expected" "$import_app" --from "$work/bad" --out "$work/bad.h5"
  ls "$work"/bad.h5* >/dev/null 2>&1 && fail "import $case_name: left $(ls "$work"/bad.h5*)"
done
for entry in "shard_missing|which does not exist" "shard_wrong_file|which does not hold it" \
  "shard_index_json|model.safetensors.index.json is not valid JSON"; do
  case_name=${entry%%|*} expected=${entry#*|}
  $py "$check" break "$work/hf_sharded" "$work/bad" "$case_name" || { fail "break $case_name"; continue; }
  expect_error "import $case_name" "$expected" "$import_app" --from "$work/bad" --out "$work/bad.h5"
  ls "$work"/bad.h5* >/dev/null 2>&1 && fail "import $case_name: left $(ls "$work"/bad.h5*)"
done
# A failed import into folders that do not exist yet leaves none of them (a NaN is found while writing).
$py "$check" break "$work/hf" "$work/bad" non_finite || fail "break non_finite"
"$import_app" --from "$work/bad" --out "$work/new_folder/sub/x.h5" >/dev/null 2>&1 &&
  fail "import of a broken folder succeeded"
[ -e "$work/new_folder" ] && fail "a failed import left $work/new_folder"
expect_error "import over a checkpoint" "already exists; pass another --out, or --overwrite" \
  "$import_app" --from "$work/hf" --out "$work/imported.h5"
expect_error "import without a folder" "--from $work/none is not a folder" \
  "$import_app" --from "$work/none" --out "$work/x.h5"

# 7. Refusals on export, and a full disk: the earlier export stays whole, no temporary folder is left.
expect_error "export a missing checkpoint" "checkpoint $work/none.h5 does not exist" \
  "$export_app" --checkpoint "$work/none.h5" --out "$work/x"
expect_error "export --dtype f16" "--dtype must be f32 or bf16, got 'f16'" \
  "$export_app" --checkpoint "$ckpt" --out "$work/x" --dtype f16
expect_error "export over an export" "already holds files; pass another --out, or --overwrite" \
  "$export_app" --checkpoint "$ckpt" --out "$work/hf"
expect_error "export over other files" "which export does not write: it is not an earlier export" \
  "$export_app" --checkpoint "$ckpt" --out "$work/text" --overwrite
mkdir -p "$work/here"
expect_error "export into the current folder" "--out . is the current folder or holds it" \
  bash -c 'cd "$1" && exec "$2" --checkpoint "$3" --out . --overwrite' _ "$work/here" "$export_app" "$ckpt"
# An export folder the user added a file to is the user's now; folders beside --out are never touched.
mkdir -p "$work/hf_notes" "$work/hf_notes.tmp" "$work/hf_notes.old"
expect_ok "export into hf_notes" "$export_app" --checkpoint "$ckpt" --out "$work/hf_notes" --overwrite
echo "my notes" >"$work/hf_notes/notes.txt"
expect_error "export over an export holding the user's file" "holds notes.txt, which export does not write" \
  "$export_app" --checkpoint "$ckpt" --out "$work/hf_notes" --overwrite
[ -e "$work/hf_notes/notes.txt" ] && [ -d "$work/hf_notes.tmp" ] && [ -d "$work/hf_notes.old" ] ||
  fail "export removed the user's files or the folders beside --out"
# An export killed mid-way leaves OUT.tmp-PID: the next export removes it when its process is gone and it
# holds only export's files, and leaves any other.
mkdir -p "$work/hf_int.tmp-999999" "$work/hf_int.tmp-999998"
touch "$work/hf_int.tmp-999999/config.json" "$work/hf_int.tmp-999998/notes.txt"
expect_ok "export from a run folder (its newest checkpoint)" "$export_app" --checkpoint "$(dirname "$(dirname "$ckpt")")" \
  --out "$work/hf_from_run"
expect_ok "export beside interrupted ones" "$export_app" --checkpoint "$ckpt" --out "$work/hf_int"
[ ! -e "$work/hf_int.tmp-999999" ] && [ -e "$work/hf_int.tmp-999998/notes.txt" ] ||
  fail "interrupted exports: $(ls -d "$work"/hf_int.tmp-*)"
sums_before=$(cd "$work/hf" && md5sum ./*)
output=$(bash -c "ulimit -f 200; exec \"$export_app\" --checkpoint \"$ckpt\" --out \"$work/hf\" --overwrite" 2>&1)
status=$?
if [ $status -ne 1 ] || ! grep -q "cannot write .* (disk full?)" <<<"$output"; then
  fail "export on a full disk: exit $status:"; echo "$output" | tail -3
else
  echo "ok   export on a full disk: $output"
fi
[ "$(cd "$work/hf" && md5sum ./*)" = "$sums_before" ] || fail "export on a full disk changed the earlier export"
ls -d "$work"/hf.tmp-* 2>/dev/null && fail "export on a full disk left its temporary folder"
expect_ok "export --overwrite" "$export_app" --checkpoint "$work/mk16.h5" --out "$work/hf" --overwrite
grep -q '"hidden_size": 32' "$work/hf/config.json" || fail "export --overwrite did not replace the export"

# 8. SentencePiece data: the export carries its tokenizer.model with a LlamaTokenizer config and the special
# ids; a tokenizer.model that is not the one the data was made with is refused.
if "$prepare" --help | grep -q -- "--tokenizer-model"; then
  for i in $(seq 1 400); do echo "Document $i: the quick brown fox, café 日本 $((i * 7919 % 1000))."; echo "%"; done \
    >"$work/sp.txt"
  expect_ok "prepare SentencePiece data" "$prepare" --input "$work/sp.txt" --out "$work/spdata" --separator % \
    --tokenizer sentencepiece --vocab 300
  expect_ok "train on SentencePiece tokens" "$train" --data "$work/spdata" --ctx 16 --batch 2 --steps 3 \
    --eval-batches 1 --sample-tokens 0 --device cpu --out "$work/sprun" --ckpt-every 3
  sp_windows=(--data "$work/spdata" --ctx 16 --batch 3 --eval-batches 2 --device cpu)
  expect_ok "eval-only (SentencePiece)" "$train" --eval-only --resume "$work/sprun/checkpoints/step_3.h5" \
    "${sp_windows[@]}" --json "$work/speval.json"
  expect_ok "export (SentencePiece)" "$export_app" --checkpoint "$work/sprun/checkpoints/step_3.h5" --out "$work/sphf"
  cmp -s "$work/sphf/tokenizer.model" "$work/spdata/tokenizer.model" || fail "export: tokenizer.model not copied"
  expect_ok "tokenizer_config.json and special ids" $py - "$work/sphf" "$work/spdata/meta.json" <<'PY'
import json, sys
folder, meta = sys.argv[1], json.load(open(sys.argv[2]))
tok = json.load(open(folder + "/tokenizer_config.json"))
config = json.load(open(folder + "/config.json"))
assert tok["tokenizer_class"] == "LlamaTokenizer" and tok["legacy"] is True, tok
assert (tok["bos_token"], tok["eos_token"], tok["unk_token"]) == ("<s>", "</s>", "<unk>"), tok
assert tok["add_bos_token"] is False and tok["add_prefix_space"] is False, tok
assert config["eos_token_id"] == meta["end_of_text"] and config["bos_token_id"] == 1, config
PY
  expect_ok "NumPy Llama loss == eval-only (SentencePiece)" $py "$check" loss "$work/sphf" "$work/spdata/val.bin" \
    16 3 2 "$work/speval.json"
  expect_ok "import (SentencePiece)" "$import_app" --from "$work/sphf" --out "$work/sp.h5" --data "$work/spdata"
  expect_ok "export the import (SentencePiece)" "$export_app" --checkpoint "$work/sp.h5" --out "$work/sphf2"
  # The folder's tokenizer.model decides which data import takes, and what --init-from trains on after an
  # import without --data.
  for i in $(seq 1 400); do echo "Entry $i: how vexingly quick daft zebras jump $((i * 31 % 97))."; echo "%"; done \
    >"$work/sp_other.txt"
  expect_ok "prepare other SentencePiece data" "$prepare" --input "$work/sp_other.txt" --out "$work/spdata_other" \
    --separator % --tokenizer sentencepiece --vocab 300
  expect_error "import with another tokenizer's data" "$work/spdata_other holds tokens of sentencepiece 300" \
    "$import_app" --from "$work/sphf" --out "$work/sp_bad.h5" --data "$work/spdata_other"
  expect_error "import with byte data" "$work/data holds tokens of bytes 257, not of $work/sphf/tokenizer.model" \
    "$import_app" --from "$work/sphf" --out "$work/sp_bad.h5" --data "$work/data"
  expect_ok "import without --data" "$import_app" --from "$work/sphf" --out "$work/sp_nodata.h5"
  sp_run=(--ctx 16 --batch 2 --eval-batches 1 --sample-tokens 0 --device cpu --steps 1)
  expect_error "init-from it on another tokenizer's data" "was trained on tokens of sentencepiece 300" \
    "$train" --data "$work/spdata_other" "${sp_run[@]}" --out "$work/sp_wrong" --init-from "$work/sp_nodata.h5"
  expect_ok "init-from it on its data" "$train" --data "$work/spdata" "${sp_run[@]}" --out "$work/sp_right" \
    --init-from "$work/sp_nodata.h5"
  expect_error "import with data of another tokenizer" "holds a model of 257 ids, but $work/spdata/meta.json gives" \
    "$import_app" --from "$work/hf" --out "$work/mismatch.h5" --data "$work/spdata"
  [ ! -e "$work/mismatch.h5" ] || fail "import with data of another tokenizer wrote $work/mismatch.h5"
  same_folders "$work/sphf" "$work/sphf2" "export -> import -> export (SentencePiece, tokenizer files)"
  cp -r "$work/spdata" "$work/spdata_bad"
  printf 'x' >>"$work/spdata_bad/tokenizer.model"
  expect_error "export with a replaced tokenizer.model" "is not the tokenizer the data was made with" \
    "$export_app" --checkpoint "$work/sprun/checkpoints/step_3.h5" --out "$work/spx" --data "$work/spdata_bad"
  expect_error "export with another tokenizer's data" "holds tokens of bytes 257, but" \
    "$export_app" --checkpoint "$work/sprun/checkpoints/step_3.h5" --out "$work/spx" --data "$work/data"
  mv "$work/spdata" "$work/spdata_moved"
  expect_error "export with its SentencePiece data gone" "spdata' does not exist (moved?)" \
    "$export_app" --checkpoint "$work/sprun/checkpoints/step_3.h5" --out "$work/spx"
  [ ! -e "$work/spx" ] || fail "export with its SentencePiece data gone wrote $work/spx"
  mv "$work/spdata_moved" "$work/spdata"
  cp -r "$work/spdata" "$work/spdata_nomodel"
  rm "$work/spdata_nomodel/tokenizer.model"
  expect_error "export with the data's tokenizer.model gone" "spdata_nomodel' holds no tokenizer.model" \
    "$export_app" --checkpoint "$work/sprun/checkpoints/step_3.h5" --out "$work/spx" --data "$work/spdata_nomodel"
  expect_ok "export with --data an export's folder (its tokenizer.model)" \
    "$export_app" --checkpoint "$work/sprun/checkpoints/step_3.h5" --out "$work/spx3" --data "$work/sphf"
else
  echo "skip SentencePiece export: prepare_data has no --tokenizer-model"
fi

# 9. Checkpoints record the RMSNorm epsilon; one without it (older files) means 1e-5.
if $py -c "import h5py" 2>/dev/null; then
  expect_ok "norm_eps recorded" $py -c "import h5py, sys; assert h5py.File(sys.argv[1])['/'].attrs['norm_eps'] == 0.25" \
    "$work/mk16.h5"
  cp "$ckpt" "$work/old.h5"
  $py -c "import h5py, sys; del h5py.File(sys.argv[1], 'r+').attrs['norm_eps']" "$work/old.h5"
  expect_ok "a checkpoint without norm_eps exports with 1e-5" "$export_app" --checkpoint "$work/old.h5" \
    --out "$work/hf_old" --data "$work/data"
  grep -q '"rms_norm_eps": 1e-05' "$work/hf_old/config.json" || fail "no norm_eps: not exported as 1e-5"
fi

if [ $failures -gt 0 ]; then echo "$failures failure(s)"; exit 1; fi
echo "all hf_export checks passed"
