#!/usr/bin/env bash
# `cleave partition` and `cleave inspect PLAN_DIR` as a user drives them: a dp x tp plan of
# the LLaMA-style variant with ZeRO-1, its files and report, and bad input that must fail
# before anything is written (an existing plan is never half-overwritten).
set -uo pipefail
cleave="$1"; src="$2"
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
fails=0; checks=0
model="$src/models/train_variants/llama/model.onnx"
fail() { echo "FAIL $*"; fails=$((fails + 1)); }
expect_fail() {  # expect_fail "description" "substring" cmd...
  local what="$1" want="$2"; shift 2
  checks=$((checks + 1))
  out=$("$@" 2>&1); rc=$?
  if [ $rc -eq 0 ]; then fail "$what: exit 0"; return; fi
  if [[ "$out" != *"$want"* ]]; then fail "$what: message lacks '$want':"; echo "$out" | tail -3; return; fi
  echo "ok   $what (exit $rc): $(echo "$out" | tail -1)"
}

checks=$((checks + 1))
if out=$("$cleave" partition "$model" --mesh dp=2,tp=2 --batch 4 --seq 16 --zero 1 --clip 1.0 -o "$tmp/plan" 2>&1); then
  n=$(ls -d "$tmp"/plan/rank_* | wc -l)
  if [ "$n" -ne 4 ]; then fail "expected 4 rank folders, got $n"
  elif [ ! -s "$tmp/plan/plan.json" ] || [ ! -s "$tmp/plan/report.txt" ]; then fail "no plan.json or report.txt"
  elif ! python3 -c "
import json, sys
p = json.load(open(sys.argv[1]))
assert p['mesh']['world_size'] == 4 and len(p['ranks']) == 4
r = p['ranks'][0]
kinds = sorted({c['kind'] for c in r['collectives']})
assert kinds == ['AllGather', 'AllReduce', 'ReduceScatter'], kinds
tp = [c for c in r['collectives'] if c['graph'] == 'training' and c['kind'] == 'AllReduce' and c['mesh_axis'] == 'tp']
assert len(tp) == 9, len(tp)  # 2 per layer each way for 2 layers, plus the LM head's input gradient
assert p['shardings']['layers.0.q.weight'] == '[tp,-]' and p['shardings']['layers.0.o.weight'] == '[-,tp]'
assert r['memory']['optimizer_state'] < p['unpartitioned']['optimizer_state'] / 2
" "$tmp/plan/plan.json"; then fail "plan.json content"
  else echo "ok   dp=2,tp=2 ZeRO-1 plan: 4 ranks, plan.json and report.txt"; fi
else
  fail "partition: $out"
fi
checks=$((checks + 1))
if out=$("$cleave" inspect "$tmp/plan" --rank 1 --dot "$tmp/r1.dot" 2>&1) &&
   [[ "$out" == *"rank 1: parameters"*"training AllReduce over tp [0,1]"*"9 x"* ]] && grep -q '#f8b4b4' "$tmp/r1.dot"; then
  echo "ok   inspect PLAN_DIR --rank 1 --dot"
else
  fail "inspect plan: $out"
fi

# Bad input: nothing written, an existing plan untouched.
touch "$tmp/plan/marker"
expect_fail "tp that does not divide" "tp=3 does not divide dim 0 of weight" \
  "$cleave" partition "$model" --mesh tp=3 --batch 4 --seq 16 -o "$tmp/plan"
expect_fail "batch not divisible by dp" "not divisible by dp=3" \
  "$cleave" partition "$model" --mesh dp=3 --batch 4 --seq 16 -o "$tmp/plan"
expect_fail "unknown mesh axis" "unknown mesh axis 'xp'" \
  "$cleave" partition "$model" --mesh xp=2 --batch 4 --seq 16 -o "$tmp/plan"
expect_fail "pipeline not yet" "pipeline parallelism (pp=2) is not implemented yet" \
  "$cleave" partition "$model" --mesh pp=2 --batch 4 --seq 16 -o "$tmp/plan"
checks=$((checks + 1))
if [ -e "$tmp/plan/marker" ] && [ -d "$tmp/plan/rank_3" ]; then echo "ok   failed runs left the existing plan alone"
else fail "a failed run touched the existing plan"; fi
checks=$((checks + 1))
if "$cleave" partition "$model" --mesh tp=2 --batch 4 --seq 16 -o "$tmp/plan" >/dev/null 2>&1 &&
   [ ! -e "$tmp/plan/marker" ] && [ ! -d "$tmp/plan/rank_2" ] && [ -d "$tmp/plan/rank_1" ] &&
   ! ls "$tmp" | grep -q '\.tmp\.\|\.old\.'; then
  echo "ok   a new plan replaced the old one whole"
else fail "replacing a plan"; fi

echo "$((checks - fails))/$checks checks passed"
[ "$checks" -gt 0 ] && [ "$fails" -eq 0 ]
