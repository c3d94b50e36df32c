#!/usr/bin/env bash
# The data a run reads is checked before anything is written: meta.json field by field (no vocabulary is
# guessed), evaluation windows that must fit in val.bin (none repeated), and llm.c's token files (header
# recognised, checked against the file's size) next to raw uint16 files.
# Usage: data_validation.sh PATH/TO/train PATH/TO/prepare_data
set -uo pipefail
train=$1 prepare=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failures=0
fail() { echo "FAIL $*"; failures=$((failures + 1)); }

# expect_error NAME "expected text" command...: non-zero exit and the text in the output.
expect_error() {
  local name=$1 expected=$2
  shift 2
  local output status
  output=$("$@" 2>&1)
  status=$?
  if [ $status -eq 0 ]; then fail "$name: exit code 0"; return; fi
  if ! grep -q -- "$expected" <<<"$output"; then
    fail "$name: expected '$expected' in:"; echo "$output" | tail -3; return
  fi
  echo "ok   $name: $(grep -m1 'error' <<<"$output")"
}

expect_ok() {
  local name=$1
  shift
  if "$@" >"$work/last.log" 2>&1; then echo "ok   $name"; else fail "$name:"; tail -3 "$work/last.log"; fi
}

# no_run NAME RUN: a refused run leaves no folder (and so no checkpoint) behind.
no_run() { [ -e "$2" ] && fail "$1: $2 was created"; }

# A small real corpus.
mkdir -p "$work/text"
for i in $(seq 1 300); do echo "Line $i of a small corpus: a wizard's job is to vex chumps quickly in fog."; echo "%"; done >"$work/text/a.txt"
"$prepare" --input "$work/text" --out "$work/data" --separator % >/dev/null || { echo "FAIL prepare_data"; exit 1; }
common=(--ctx 16 --batch 2 --eval-batches 1 --sample-tokens 0 --log-every 100 --device cpu)

# One document: the split is the last ~10% of the tokens, and prepare_data says so.
"$prepare" --input "$work/text/a.txt" --out "$work/onedoc" 2>&1 | grep -q "fewer than 10 documents: val.bin is the last" &&
  echo "ok   one document: the split is said" || fail "one document: no note on the validation split"

# A --out that cannot be made is refused before any work; an interrupted write's temporary files are
# removed (said), a user's own .tmp file is not; a long line with no break says where the split fell.
touch "$work/a_file"
expect_error "prepare_data into a file's path" "cannot create --out $work/a_file/ds" \
  "$prepare" --input "$work/text" --out "$work/a_file/ds" --separator %
mkdir -p "$work/leftover" && touch "$work/leftover/train.bin.tmp" && echo notes >"$work/leftover/mine.tmp"
"$prepare" --input "$work/text" --out "$work/leftover" --separator % 2>&1 |
  grep -q "removing $work/leftover/train.bin.tmp, left by an interrupted prepare_data" &&
  [ ! -e "$work/leftover/train.bin.tmp" ] && [ -e "$work/leftover/mine.tmp" ] &&
  echo "ok   an interrupted write's leftovers removed, the user's file kept" || fail "prepare_data leftovers"

# A title line then one long line: the split stays near 10% (cut inside the line), not at the line break.
{ echo "Title"; for i in $(seq 1 3000); do printf 'word%d ' "$i"; done; echo; } >"$work/title_then_long.txt"
"$prepare" --input "$work/title_then_long.txt" --out "$work/tail_split" | grep -q "10% of the tokens (no line break" ||
  fail "prepare title_then_long: the split's note"
python3 - "$work/tail_split/meta.json" <<'PY' && echo "ok   one long line: validation is ~10% of the tokens" || fail "one long line: the split"
import json, sys
meta = json.load(open(sys.argv[1]))
share = meta["val_tokens"] / (meta["train_tokens"] + meta["val_tokens"])
assert 0.08 <= share <= 0.12, meta
PY

# A separator line with a Windows line end still separates; a separator that matches nothing is reported.
printf 'doc one\r\n%%\r\ndoc two\r\n%%\r\n' >"$work/crlf.txt"
output=$("$prepare" --input "$work/crlf.txt" --out "$work/crlf" 2>&1 --separator %)
grep -q "^2 documents" <<<"$output" && echo "ok   CRLF separator lines separate" || { fail "CRLF separator:"; echo "$output"; }
output=$("$prepare" --input "$work/crlf.txt" --out "$work/crlf_none" 2>&1 --separator %%)
grep -q "note: no line is --separator '%%': each file is one document" <<<"$output" &&
  echo "ok   a separator that never matches is reported" || { fail "unmatched separator:"; echo "$output"; }

# A dataset prepared inside its own input folder, then again in place: the first one's files are not input.
mkdir -p "$work/inplace"
cp "$work/text/a.txt" "$work/inplace/"
first=$("$prepare" --input "$work/inplace" --out "$work/inplace/data" --separator % 2>&1 | grep "documents ->")
again=$("$prepare" --input "$work/inplace" --out "$work/inplace/data" --separator % --overwrite 2>&1 | grep "documents ->")
[ -n "$first" ] && [ "$first" = "$again" ] && echo "ok   prepared again in place: the same documents" ||
  fail "prepared again in place: '$first' then '$again'"
expect_error "--out the input folder" "is the input folder: pass another --out" \
  "$prepare" --input "$work/inplace" --out "$work/inplace/" --separator %

# Binary files: skipped inside a folder (and counted), refused when named alone.
mkdir -p "$work/mixed"
cp "$work/text/a.txt" "$work/mixed/"
{ printf 'text\000more'; head -c 20000 /dev/urandom; } >"$work/mixed/noise.txt"
output=$("$prepare" --input "$work/mixed" --out "$work/mixed_data" --separator % 2>&1)
grep -q "skipped 1: 1 not text" <<<"$output" && echo "ok   a file with NUL bytes in a folder is skipped" ||
  { fail "a binary file in a folder:"; echo "$output" | tail -3; }
expect_error "a binary file named alone" "is not text (it holds NUL bytes)" \
  "$prepare" --input "$work/mixed/noise.txt" --out "$work/noise_data"

# prepare_data's meta.json names the tokenizer, the vocabulary and the end-of-text id.
python3 - "$work/data/meta.json" <<'PY' || fail "meta.json fields"
import json, sys
meta = json.load(open(sys.argv[1]))
assert (meta["tokenizer"], meta["vocab_size"], meta["end_of_text"]) == ("bytes", 257, 256), meta
PY

# with_meta NAME TEXT: a copy of the dataset whose meta.json is TEXT.
with_meta() {
  mkdir -p "$work/$1" && cp "$work/data/train.bin" "$work/data/val.bin" "$work/$1/"
  printf '%s' "$2" >"$work/$1/meta.json"
}
with_meta malformed '{"tokenizer": "bytes", "vocab_size": 257,'
expect_error "malformed meta.json" "$work/malformed/meta.json: not valid JSON" \
  "$train" --data "$work/malformed" "${common[@]}" --steps 1 --out "$work/run_malformed"
no_run "malformed meta.json" "$work/run_malformed"
with_meta novocab '{"tokenizer": "bytes", "end_of_text": 256}'
expect_error "missing vocab_size" "$work/novocab/meta.json: vocab_size is missing" \
  "$train" --data "$work/novocab" "${common[@]}" --steps 1 --out "$work/run_novocab"
no_run "missing vocab_size" "$work/run_novocab"
n=0
for bad in -257 0 70000 257.5 '"257"'; do
  n=$((n + 1))
  with_meta "vocab$n" "{\"tokenizer\": \"bytes\", \"vocab_size\": $bad}"
  expect_error "vocab_size $bad" "$work/vocab$n/meta.json: vocab_size must be" \
    "$train" --data "$work/vocab$n" "${common[@]}" --steps 1 --out "$work/run_vocab$n"
  no_run "vocab_size $bad" "$work/run_vocab$n"
done
with_meta tokenizer '{"tokenizer": "wordpiece", "vocab_size": 257}'
expect_error "unknown tokenizer" "$work/tokenizer/meta.json: tokenizer 'wordpiece' is unknown" \
  "$train" --data "$work/tokenizer" "${common[@]}" --steps 1 --out "$work/run_tokenizer"
no_run "unknown tokenizer" "$work/run_tokenizer"
# A folder of text where a dataset belongs: named as such, with the way to make one.
expect_error "a text folder as --data" "holds no train.bin and no meta.json: it is not a dataset" \
  "$train" --data "$work/text" "${common[@]}" --steps 1 --out "$work/run_text"
no_run "a text folder as --data" "$work/run_text"
# Without meta.json the vocabulary comes from --vocab, never from a guess.
mkdir -p "$work/nometa" && cp "$work/data/train.bin" "$work/data/val.bin" "$work/nometa/"
expect_error "no meta.json, no --vocab" "$work/nometa/meta.json does not exist; pass --vocab N" \
  "$train" --data "$work/nometa" "${common[@]}" --steps 1 --out "$work/run_nometa"
no_run "no meta.json, no --vocab" "$work/run_nometa"
expect_ok "no meta.json, --vocab 257" "$train" --data "$work/nometa" "${common[@]}" --vocab 257 --steps 2 \
  --out "$work/run_nometa_vocab"

# A short val.bin: 60 tokens hold 3 windows of 17, so 2 batches of 2 do not fit (they used to wrap around).
mkdir -p "$work/shortval" && cp "$work/data/train.bin" "$work/data/meta.json" "$work/shortval/"
head -c 120 "$work/data/val.bin" >"$work/shortval/val.bin"
python3 -c 'import json,os,sys; d=sys.argv[1]; m=json.load(open(d+"/meta.json")); m["val_tokens"]=os.path.getsize(d+"/val.bin")//2; json.dump(m,open(d+"/meta.json","w"))' "$work/shortval"
expect_error "eval windows beyond val.bin" \
  "--eval-batches 2 x --batch 2 needs 4 windows of 17 tokens; $work/shortval/val.bin has room for 3; lower --eval-batches or --batch" \
  "$train" --data "$work/shortval" "${common[@]}" --eval-batches 2 --steps 2 --out "$work/run_shortval"
no_run "eval windows beyond val.bin" "$work/run_shortval"
# Not one batch of windows: fewer --eval-batches cannot help, so the message does not suggest it.
expect_error "val.bin shorter than a batch" \
  "one evaluation batch (--batch 4) needs 4 windows of 17 tokens; $work/shortval/val.bin has room for 3: lower --batch or --ctx, or give prepare_data more text" \
  "$train" --data "$work/shortval" "${common[@]}" --batch 4 --steps 2 --out "$work/run_shortval4"
expect_ok "eval windows that fit" "$train" --data "$work/shortval" "${common[@]}" --eval-batches 1 --steps 2 \
  --out "$work/run_shortval_ok"
expect_error "eval-only windows beyond val.bin" "needs 4 windows of 17 tokens; $work/shortval/val.bin has room for 3" \
  "$train" --eval-only --resume "$work/run_shortval_ok/checkpoints/step_2.h5" --data "$work/shortval" --ctx 16 \
  --batch 2 --eval-batches 2

# A corpus too small for train's default context is prepared, with a note saying so.
printf 'abc' >"$work/tiny.txt"
"$prepare" --input "$work/tiny.txt" --out "$work/tiny_data" 2>&1 | grep -q "note: val.bin holds only 1 token;" &&
  echo "ok   a corpus too small for the default context is noted" || fail "no note for a tiny corpus"

# prepare_data streams its input: 160 MB of text (every token file and the text itself would be about 1 GB
# held at once) in less than 400 MB of memory, every byte and document end in the token files, the progress
# lines on stderr.
python3 - "$work/large.txt" <<'PY'
import sys
block = "".join(f"line {i} of a document, with words enough to look like text\n" + ("%\n" if i % 7 == 6 else "")
                for i in range(16000))
with open(sys.argv[1], "w") as f:
    for _ in range(160_000_000 // len(block) + 1):
        f.write(block)
PY
python3 - "$prepare" "$work/large.txt" "$work/large_data" <<'PY' && echo "ok   160 MB prepared in bounded memory" || fail "160 MB of text"
import json, os, resource, subprocess, sys
prepare, text, out = sys.argv[1:]
run = subprocess.run([prepare, "--input", text, "--out", out, "--separator", "%"], capture_output=True, text=True)
assert run.returncode == 0, run.stderr
assert "encoding on" in run.stderr, run.stderr
peak_mb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
meta = json.load(open(os.path.join(out, "meta.json")))
separators = open(text, "rb").read().count(b"%\n")
tokens = meta["train_tokens"] + meta["val_tokens"]
assert tokens == os.path.getsize(text) - 2 * separators + meta["documents"], (tokens, meta)
assert peak_mb < 400, f"peak {peak_mb:.0f} MB"
print(f"     peak {peak_mb:.0f} MB for {os.path.getsize(text) / 1e6:.0f} MB of text")
PY
# Stopped while encoding (SIGTERM, as a scheduler sends): a folder it made is removed, an earlier dataset in
# the folder is left whole, and no temporary file stays.
cp -r "$work/data" "$work/kept_data"
python3 - "$prepare" "$work/large.txt" "$work/stopped_data" "$work/kept_data" <<'PY' &&
import os, signal, subprocess, sys
prepare, text, new_out, kept_out = sys.argv[1:]
before = {name: open(os.path.join(kept_out, name), "rb").read() for name in os.listdir(kept_out)}
for out in (new_out, kept_out):
    run = subprocess.Popen([prepare, "--input", text, "--out", out, "--separator", "%", "--overwrite"],
                           stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    for line in run.stderr:
        if line.startswith("encoding on"):
            break
    run.send_signal(signal.SIGTERM)
    run.stderr.read()
    assert run.wait() == -signal.SIGTERM, run.returncode
assert not os.path.exists(new_out), os.listdir(new_out)
after = {name: open(os.path.join(kept_out, name), "rb").read() for name in os.listdir(kept_out)}
assert after == before, sorted(after)
PY
  echo "ok   stopped while encoding: its new folder removed, an earlier dataset whole" ||
  fail "prepare_data stopped while encoding"
rm -rf "$work/large.txt" "$work/large_data"

# A corpus folder's .git, an earlier dataset inside it and a link to a folder are not text of the corpus:
# only its three documents are read, and the rest is counted as skipped.
mkdir -p "$work/tree/.git" "$work/tree/docs"
for i in 1 2 3; do echo "Document $i of the tree." >"$work/tree/docs/d$i.txt"; done
echo "a hook script" >"$work/tree/.git/hook"
ln -s "$work/tree/docs" "$work/tree/link"
expect_ok "prepare a tree" "$prepare" --input "$work/tree" --out "$work/tree/earlier"
expect_ok "prepare it again beside the earlier dataset" "$prepare" --input "$work/tree" --out "$work/tree_data"
grep -q "^3 documents" "$work/last.log" &&
  grep -q "read 3 files; skipped 3: 1 hidden, 1 earlier dataset, 1 link to a folder" "$work/last.log" ||
  fail "a tree with .git, a dataset and a link: $(cat "$work/last.log")"

# A train.bin or val.bin cut short after prepare_data (a copy that ran out of room): meta.json's counts
# say so, in training and in --eval-only.
mkdir -p "$work/cut" && cp "$work/data/"* "$work/cut/" && truncate -s 2000 "$work/cut/train.bin"
expect_error "train.bin cut short" "$work/cut/train.bin holds 1000 tokens, but $work/cut/meta.json records" \
  "$train" --data "$work/cut" "${common[@]}" --steps 1 --out "$work/run_cut"
no_run "train.bin cut short" "$work/run_cut"
cp "$work/data/train.bin" "$work/cut/" && truncate -s 2000 "$work/cut/val.bin"
expect_error "val.bin cut short, --eval-only" "the file is cut short or was replaced" \
  "$train" --eval-only --resume "$work/run_shortval_ok/checkpoints/step_2.h5" --data "$work/cut" --ctx 16 \
  --batch 2 --eval-batches 1

# llm.c's token files: the same tokens behind a 256-int32 header train to the same losses.
# llmc IN OUT [VERSION [COUNT_DELTA]]: IN's uint16 tokens behind llm.c's header.
llmc() {
  python3 - "$@" <<'PY'
import struct, sys
src, dst = sys.argv[1], sys.argv[2]
version = int(sys.argv[3]) if len(sys.argv) > 3 else 1
delta = int(sys.argv[4]) if len(sys.argv) > 4 else 0
tokens = open(src, "rb").read()
header = [20240520, version, len(tokens) // 2 + delta] + [0] * 253
open(dst, "wb").write(struct.pack("<256i", *header) + tokens)
PY
}
mkdir -p "$work/llmc"
llmc "$work/data/train.bin" "$work/llmc/train.bin" && llmc "$work/data/val.bin" "$work/llmc/val.bin" &&
  cp "$work/data/meta.json" "$work/llmc/" || fail "writing llm.c files"
run_args=("${common[@]}" --steps 6 --eval-every 3 --eval-batches 2 --ckpt-every 0)
expect_ok "train on raw tokens" "$train" --data "$work/data" "${run_args[@]}" --out "$work/run_raw"
expect_ok "train on llm.c files" "$train" --data "$work/llmc" "${run_args[@]}" --out "$work/run_llmc"
losses() { grep -o '"\(val_\)\?loss": [^,}]*' "$1/metrics.jsonl"; }
if [ -z "$(losses "$work/run_raw")" ] || [ "$(losses "$work/run_raw")" != "$(losses "$work/run_llmc")" ]; then
  fail "llm.c files: losses differ from the raw tokens'"; diff <(losses "$work/run_raw") <(losses "$work/run_llmc") | head -4
else
  echo "ok   llm.c files give the raw tokens' losses ($(losses "$work/run_raw" | tail -1))"
fi
# As llm.c's data come, without meta.json: --vocab.
mkdir -p "$work/llmc_nometa" && cp "$work/llmc/"*.bin "$work/llmc_nometa/"
expect_ok "llm.c files with --vocab" "$train" --data "$work/llmc_nometa" "${run_args[@]}" --vocab 257 \
  --out "$work/run_llmc_nometa"
[ "$(losses "$work/run_raw")" = "$(losses "$work/run_llmc_nometa")" ] || fail "llm.c files with --vocab: losses differ"
# Damaged llm.c files are refused, named, before anything is written.
mkdir -p "$work/llmc_bad" && cp "$work/llmc/val.bin" "$work/llmc/meta.json" "$work/llmc_bad/"
size=$(stat -c %s "$work/llmc/train.bin")
head -c $((size - 100)) "$work/llmc/train.bin" >"$work/llmc_bad/train.bin"
expect_error "truncated llm.c file" "token file '$work/llmc_bad/train.bin' (llm.c format, magic 20240520) is truncated" \
  "$train" --data "$work/llmc_bad" "${common[@]}" --steps 1 --out "$work/run_llmc_truncated"
no_run "truncated llm.c file" "$work/run_llmc_truncated"
head -c 600 "$work/llmc/train.bin" >"$work/llmc_bad/train.bin"
expect_error "llm.c file cut inside its header" "is truncated: 600 bytes, shorter than its 1024-byte header" \
  "$train" --data "$work/llmc_bad" "${common[@]}" --steps 1 --out "$work/run_llmc_header"
llmc "$work/data/train.bin" "$work/llmc_bad/train.bin" 2
expect_error "unknown llm.c version" "has header version 2; only version 1 (uint16 tokens) is supported" \
  "$train" --data "$work/llmc_bad" "${common[@]}" --steps 1 --out "$work/run_llmc_version"
llmc "$work/data/train.bin" "$work/llmc_bad/train.bin" 1 -5
expect_error "llm.c file longer than its header says" "has 10 bytes after the" \
  "$train" --data "$work/llmc_bad" "${common[@]}" --steps 1 --out "$work/run_llmc_extra"
no_run "damaged llm.c files" "$work/run_llmc_version"

echo "$failures failure(s)"
[ $failures -eq 0 ]
