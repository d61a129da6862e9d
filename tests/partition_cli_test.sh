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

# A dp x pp x tp pipeline plan of the 4-layer GPT: per-stage parts, Send/Recv with bytes per
# step equal to the residual stream's, the schedule in plan.json and inspect's grid.
deep="$src/models/train_variants/gpt_deep/model.onnx"
checks=$((checks + 1))
if out=$("$cleave" partition "$deep" --mesh dp=2,pp=2,tp=2 --batch 8 --seq 16 --microbatches 4 --zero 1 \
           --schedule interleaved --virtual-stages 2 -o "$tmp/pplan" 2>&1) &&
   python3 -c "
import json, sys
p = json.load(open(sys.argv[1]))
s = p['schedule']
assert s['kind'] == 'interleaved' and s['stages'] == 2 and s['virtual_stages'] == 2 and s['microbatches'] == 4, s
assert s['layers'] == 4 and s['first_layer'] == [0, 1, 2, 3], s
r = p['ranks'][0]
assert [st['stage'] for st in r['files']['stages']] == [0, 2], r['files']
# Micro-batch of 8/4 = 2 rows, 1 per dp rank: the stream [1, 16, 32] fp32 = 2048 bytes.
assert all(m['bytes'] == 2048 and m['bytes_per_step'] == 4 * 2048 for m in r['p2p']), r['p2p']
sends = [m for m in r['p2p'] if m['kind'] == 'Send']
# Rank 0 holds virtual stages 0 and 2: activations out of both, gradients out of stage 2.
assert sorted((m['direction'], m['peer']) for m in sends) == [('backward', 2), ('forward', 2), ('forward', 2)], sends
" "$tmp/pplan/plan.json" && [ -s "$tmp/pplan/rank_0/stage_2_backward.onnx" ]; then
  echo "ok   dp=2,pp=2,tp=2 interleaved plan: stage parts, Send/Recv bytes, schedule"
else
  fail "pipeline plan: $out"
fi
checks=$((checks + 1))
if out=$("$cleave" inspect "$tmp/pplan" --rank 2 --svg "$tmp/r2.svg" 2>&1) &&
   [[ "$out" == *"training Send to rank 0"*"schedule: interleaved, 2 pipeline ranks x 2 chunk(s), 4 micro-batches; bubble"* ]] &&
   [[ "$out" == *"| rank0 rank1"* ]] && grep -q '<svg' "$tmp/r2.svg"; then
  echo "ok   inspect of the pipeline plan: messages, schedule grid, svg"
else
  fail "inspect pipeline plan: $out"
fi

# The vocabulary-parallel loss: the logits are never gathered; the loss adds three AllReduces
# of one value per token (row max, sum of exponentials, target score) over tp.
checks=$((checks + 1))
if out=$("$cleave" partition "$model" --mesh dp=2,tp=2 --batch 4 --seq 16 --vocab-parallel-loss -o "$tmp/vplan" 2>&1) &&
   python3 -c "
import json, sys
base, vp = (json.load(open(f)) for f in sys.argv[1:3])
assert vp['vocab_parallel_loss'] is True and base['vocab_parallel_loss'] is False
def tp(p, kind):
    return [c for c in p['ranks'][0]['collectives'] if c['graph'] == 'training' and c['kind'] == kind and c['mesh_axis'] == 'tp']
assert len(tp(base, 'AllGather')) == 1 and tp(vp, 'AllGather') == [], (tp(base, 'AllGather'), tp(vp, 'AllGather'))
# 2 rows x 16 tokens per dp rank: 32 values of 4 bytes per loss AllReduce.
loss = [c for c in tp(vp, 'AllReduce') if c['bytes'] == 128]
assert len(loss) == 3, tp(vp, 'AllReduce')
moved = lambda p: sum(c['bytes'] for c in p['ranks'][0]['collectives'] if c['graph'] == 'training')
assert moved(vp) < moved(base), (moved(vp), moved(base))
print(moved(base), moved(vp))
" "$tmp/plan/plan.json" "$tmp/vplan/plan.json" > "$tmp/vp.txt" 2>&1; then
  echo "ok   --vocab-parallel-loss: no logits gather, 3 per-token AllReduces (training bytes $(cat "$tmp/vp.txt"))"
else
  fail "vocab-parallel plan: $out $(cat "$tmp/vp.txt" 2>/dev/null)"
fi
expect_fail "vocab-parallel loss without tp" "--vocab-parallel-loss shards the vocabulary over tp, and the mesh has tp=1" \
  "$cleave" partition "$model" --mesh dp=2 --batch 4 --seq 16 --vocab-parallel-loss -o "$tmp/plan"

# Bad input: nothing written, an existing plan untouched.
touch "$tmp/plan/marker"
expect_fail "tp that does not divide" "tp=3 does not divide dim 0 of weight" \
  "$cleave" partition "$model" --mesh tp=3 --batch 4 --seq 16 -o "$tmp/plan"
expect_fail "batch not divisible by dp" "not divisible by dp=3" \
  "$cleave" partition "$model" --mesh dp=3 --batch 4 --seq 16 -o "$tmp/plan"
expect_fail "unknown mesh axis" "unknown mesh axis 'xp'" \
  "$cleave" partition "$model" --mesh xp=2 --batch 4 --seq 16 -o "$tmp/plan"
expect_fail "more stages than layers" "4 stages for a model of 2 layers" \
  "$cleave" partition "$model" --mesh pp=4 --batch 4 --seq 16 --microbatches 4 -o "$tmp/plan"
expect_fail "a cut that leaves a stage empty" "cut 2 is outside the model's layers" \
  "$cleave" partition "$model" --mesh pp=2 --batch 4 --seq 16 --microbatches 2 --pp-cuts 2 -o "$tmp/plan"
expect_fail "interleaved with one chunk" "interleaved" \
  "$cleave" partition "$model" --mesh pp=2 --batch 4 --seq 16 --microbatches 2 --schedule interleaved -o "$tmp/plan"
expect_fail "micro-batches that do not divide the batch" "not divisible by dp=1 x microbatches=3" \
  "$cleave" partition "$model" --mesh pp=2 --batch 4 --seq 16 --microbatches 3 -o "$tmp/plan"
expect_fail "unknown schedule" "schedule" \
  "$cleave" partition "$model" --mesh pp=2 --batch 4 --seq 16 --microbatches 2 --schedule zigzag -o "$tmp/plan"
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
