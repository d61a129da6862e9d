#!/usr/bin/env bash
# `mpirun -np N cleave train PLAN_DIR` end to end, oversubscribed on this machine's cores: the
# loss trajectory of each partitioned run equals the single-rank `cleave train` trajectory
# (1e-5 relative per step), resume from sharded checkpoints continues the uninterrupted curve,
# and bad launches, a killed rank and a hung rank end the job with a message and a non-zero
# exit instead of hanging.
set -uo pipefail
cleave="$1"; src="$2"
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
# No network interfaces are needed between processes of one machine.
export OMPI_MCA_btl=self,vader OMPI_MCA_btl_vader_single_copy_mechanism=none
mpirun=(mpirun --oversubscribe --bind-to none)
fails=0; checks=0
fail() { echo "FAIL $*"; fails=$((fails + 1)); }
tiny="$src/models/tiny_gpt/model.onnx"; corpus="$src/models/tiny_gpt/corpus.txt"
deep="$src/models/train_variants/gpt_deep/model.onnx"
common=(--steps 10 --no-shuffle --val-fraction 0 --lr 1e-3 --warmup 2 --threads 1 --plot none)

# Tokens below 64 for the 4-layer GPT (vocab 64), as a .bin file of uint16.
python3 -c "
import random, struct, sys
random.seed(3)
open(sys.argv[1], 'wb').write(struct.pack('<4096H', *[random.randrange(64) for _ in range(4096)]))
" "$tmp/tokens64.bin"

same_losses() {  # same_losses A.jsonl B.jsonl: per-step losses within 1e-5 relative
  python3 - "$1" "$2" <<'EOF'
import json, sys
a = [json.loads(l) for l in open(sys.argv[1])]
b = [json.loads(l) for l in open(sys.argv[2])]
assert len(a) == len(b) == 10, (len(a), len(b))
for x, y in zip(a, b):
    assert x["step"] == y["step"]
    rel = abs(x["loss"] - y["loss"]) / abs(y["loss"])
    assert rel < 1e-5, f"step {x['step']}: loss {x['loss']} vs {y['loss']} (rel {rel:.2e})"
    assert abs(x["grad_norm"] - y["grad_norm"]) <= 1e-4 * y["grad_norm"], (x, y)
print(f"{len(a)} steps match, loss {a[0]['loss']:.4f} -> {a[-1]['loss']:.4f}")
EOF
}

# name model data batch mesh [partition flags...]
case_run() {
  local name="$1" model="$2" data="$3" batch="$4" mesh="$5"; shift 5
  checks=$((checks + 1))
  local n
  n=$(python3 -c "import math; print(math.prod(int(x.split('=')[1]) for x in '$mesh'.split(',')))")
  if ! out=$("$cleave" train "$model" --data "$data" --batch "$batch" --seq 16 "${common[@]}" --clip 1.0 \
               --metrics "$tmp/$name.single.jsonl" 2>&1); then fail "$name single-rank: $out"; return; fi
  if ! out=$("$cleave" partition "$model" --mesh "$mesh" --batch "$batch" --seq 16 --clip 1.0 "$@" \
               -o "$tmp/$name.plan" 2>&1); then fail "$name partition: $out"; return; fi
  if ! out=$(timeout 300 "${mpirun[@]}" -np "$n" "$cleave" train "$tmp/$name.plan" --data "$data" "${common[@]}" \
               --metrics "$tmp/$name.jsonl" 2>&1); then fail "$name mpirun: $out"; return; fi
  [[ "$out" == *"compute"*"comm"*"idle"* ]] || { fail "$name: no compute/comm/idle in the progress line"; return; }
  local lines
  lines=$(echo "$out" | grep -c '^step ')
  [ "$lines" -eq 10 ] || { fail "$name: $lines progress lines (one rank prints)"; return; }
  for r in $(seq 0 $((n - 1))); do
    [ -s "$tmp/$name.rank$r.jsonl" ] || { fail "$name: rank $r wrote no metrics"; return; }
  done
  if msg=$(same_losses "$tmp/$name.rank0.jsonl" "$tmp/$name.single.jsonl" 2>&1); then
    echo "ok   $name on $n ranks ($mesh $*): $msg"
  else
    fail "$name: $msg"
  fi
}

case_run tp2 "$tiny" "$corpus" 4 tp=2
case_run tp2_sp "$tiny" "$corpus" 4 tp=2 --sp
case_run pp2_1f1b "$tiny" "$corpus" 4 pp=2 --microbatches 4
case_run pp2_interleaved "$deep" "$tmp/tokens64.bin" 4 pp=2 --microbatches 2 --schedule interleaved --virtual-stages 2
case_run dp2_zero1 "$tiny" "$corpus" 4 dp=2 --zero 1
case_run dp2pp2tp2_zero1 "$tiny" "$corpus" 4 dp=2,pp=2,tp=2 --microbatches 2 --zero 1
case_run pp2tp2_recompute_full "$tiny" "$corpus" 4 pp=2,tp=2 --microbatches 2 --recompute full
case_run dp2_zero2_recompute_selective "$tiny" "$corpus" 4 dp=2 --zero 2 --recompute selective
case_run dp2pp2tp2_vocab_parallel "$deep" "$tmp/tokens64.bin" 4 dp=2,pp=2,tp=2 --microbatches 2 --sp \
  --vocab-parallel-loss
case_run pp2tp2_fused_attention "$deep" "$tmp/tokens64.bin" 4 pp=2,tp=2 --microbatches 2 --fuse-attention

# Gradient reductions overlapping the backward: dp=2, and dp=2 x pp=2 (1F1B), in 20 KB
# buckets with a profile per rank, against the same plan with the reductions left in the
# optimizer step: the same losses bit for bit, and the traces show the reductions on their own
# track, finished before the optimizer reads them, and in each step some of them handed over
# while gradients were still being accumulated (the backward still ran).
for mesh in "dp=2" "dp=2,pp=2 --microbatches 2"; do
set -- $mesh
checks=$((checks + 1))
msg=""
n=$(python3 -c "import math; print(math.prod(int(x.split('=')[1]) for x in '$1'.split(',')))")
rm -rf "$tmp"/ov_*.jsonl "$tmp"/trace.rank*.json "$tmp/overlap.plan"
if "$cleave" partition "$tiny" --mesh "$@" --batch 4 --seq 16 --clip 1.0 --bucket-mb 0.02 \
     -o "$tmp/overlap.plan" >/dev/null 2>&1 &&
   "${mpirun[@]}" -np "$n" "$cleave" train "$tmp/overlap.plan" --data "$corpus" "${common[@]}" \
     --metrics "$tmp/ov_on.jsonl" --profile "$tmp/trace.json" --profile-steps 2 >/dev/null 2>&1 &&
   "${mpirun[@]}" -np "$n" "$cleave" train "$tmp/overlap.plan" --data "$corpus" "${common[@]}" \
     --metrics "$tmp/ov_off.jsonl" --no-overlap-grad-reduce >/dev/null 2>&1 &&
   msg=$(python3 - "$tmp" "$n" <<'EOF2'
import json, sys
tmp, n = sys.argv[1], int(sys.argv[2])
last = n - 1  # the rank that holds the loss
on = [json.loads(l) for l in open(f"{tmp}/ov_on.rank{last}.jsonl")]
off = [json.loads(l) for l in open(f"{tmp}/ov_off.rank{last}.jsonl")]
assert [x["loss"] for x in on] == [x["loss"] for x in off], "losses differ"
assert [x["grad_norm"] for x in on] == [x["grad_norm"] for x in off], "gradient norms differ"
assert all("overlapped_comm_ms" in x for x in on)
counts = []
for r in range(n):
    t = json.load(open(f"{tmp}/trace.rank{r}.json"))
    names = {e["tid"]: e["args"]["name"] for e in t["traceEvents"] if e["name"] == "thread_name"}
    # (A "collectives" track holds the graphs' own asynchronous collectives, the loss's sum.)
    assert names.get(0) == "compute" and "gradient reduction" in names.values(), names
    reduction = next(k for k, v in names.items() if v == "gradient reduction")
    ev = [e for e in t["traceEvents"] if e["ph"] == "X"]
    red = [e for e in ev if e["tid"] == reduction]
    # The optimizer's first node of each profiled step: AdamW reads the reduced gradients.
    starts = sorted({e["ts"] for e in ev if e["tid"] == 0 and e["cat"] == "AdamW"})
    accumulations = [e["ts"] for e in ev if e["tid"] == 0 and e["cat"] == "InPlaceAccumulator"]
    assert len(red) > 0 and len(red) % 2 == 0, len(red)
    early = 0
    for e in red:
        q = int(e["args"]["queued_us"])
        later = [s for s in starts if s > q]
        assert later and later[0] >= e["ts"] + e["dur"], (e["name"], q, later[:1])
        early += any(q < a < later[0] for a in accumulations)
    assert early >= 2, f"rank {r}: {early} reductions handed over during the backward"
    counts.append((len(red) // 2, early))
print(f"losses identical over {len(on)} steps; per rank (reductions per step, handed over in the backward "
      f"over 2 steps): {counts}")
EOF2
   ); then echo "ok   overlapped gradient reductions ($1): $msg"; else fail "overlapped reductions ($1): $msg"; fi
done

# Asynchronous collectives: a ZeRO-2 plan (each gradient reduce-scattered inside the backward)
# and a tp=2 plan, with a profile per rank, against the same plans with the collectives run in
# line: the same losses bit for bit, the collectives on their own track of each rank's trace,
# and compute running while some of them were in flight.
for mesh in "dp=2 --zero 2" "tp=2"; do
set -- $mesh
checks=$((checks + 1))
msg=""
rm -rf "$tmp"/ac_*.jsonl "$tmp"/actrace.rank*.json "$tmp/async.plan"
if "$cleave" partition "$tiny" --mesh "$@" --batch 4 --seq 16 --clip 1.0 -o "$tmp/async.plan" >/dev/null 2>&1 &&
   "${mpirun[@]}" -np 2 "$cleave" train "$tmp/async.plan" --data "$corpus" "${common[@]}" \
     --metrics "$tmp/ac_on.jsonl" --profile "$tmp/actrace.json" --profile-steps 2 >/dev/null 2>&1 &&
   "${mpirun[@]}" -np 2 "$cleave" train "$tmp/async.plan" --data "$corpus" "${common[@]}" \
     --metrics "$tmp/ac_off.jsonl" --no-async-collectives >/dev/null 2>&1 &&
   msg=$(python3 - "$tmp" <<'EOF2'
import json, sys
tmp = sys.argv[1]
on = [json.loads(l) for l in open(f"{tmp}/ac_on.rank1.jsonl")]
off = [json.loads(l) for l in open(f"{tmp}/ac_off.rank1.jsonl")]
assert len(on) == len(off) == 10, (len(on), len(off))
assert [x["loss"] for x in on] == [x["loss"] for x in off], "losses differ"
assert [x["grad_norm"] for x in on] == [x["grad_norm"] for x in off], "gradient norms differ"
per_rank = []
for r in range(2):
    t = json.load(open(f"{tmp}/actrace.rank{r}.json"))
    names = {e["tid"]: e["args"]["name"] for e in t["traceEvents"] if e["name"] == "thread_name"}
    track = [k for k, v in names.items() if v == "collectives"]
    assert track, f"rank {r}: no collectives track in {names}"
    ev = [e for e in t["traceEvents"] if e["ph"] == "X"]
    col = [e for e in ev if e["tid"] == track[0]]
    compute = [e["ts"] for e in ev if e["tid"] == 0]
    assert col, f"rank {r}: no collective on its track"
    # A compute node started after the collective was queued and before it finished.
    busy = sum(any(int(c["args"]["queued_us"]) < ts < c["ts"] + c["dur"] for ts in compute) for c in col)
    assert busy > 0, f"rank {r}: no collective overlapped compute"
    per_rank.append((len(col) // 2, busy))
print(f"losses identical over {len(on)} steps; per rank (collectives per step, overlapping compute "
      f"over 2 steps): {per_rank}")
EOF2
   ); then echo "ok   asynchronous collectives ($*): $msg"; else fail "asynchronous collectives ($*): $msg"; fi
done

# Mixed precision on a dp=2 x pp=2 x tp=2 plan: bf16 with sequence parallelism (its gathers of
# the products' operands move bf16), and fp16 with loss scaling (every rank agrees on skipping an
# overflowing step), within 2% of the fp32 single-rank curve.
for prec in bf16 fp16; do
  checks=$((checks + 1))
  msg=""
  sp=()
  if [ "$prec" = bf16 ]; then sp=(--sp); fi
  if "$cleave" partition "$tiny" --mesh dp=2,pp=2,tp=2 --batch 4 --seq 16 --microbatches 2 --clip 1.0 \
       --precision "$prec" "${sp[@]}" -o "$tmp/$prec.plan" >/dev/null 2>&1 &&
     "${mpirun[@]}" -np 8 "$cleave" train "$tmp/$prec.plan" --data "$corpus" "${common[@]}" \
       --metrics "$tmp/$prec.jsonl" >/dev/null 2>&1 &&
     msg=$(python3 - "$tmp/$prec.rank0.jsonl" "$tmp/tp2.single.jsonl" <<'EOF2'
import json, sys
b = [json.loads(l)["loss"] for l in open(sys.argv[1])]
f = [json.loads(l)["loss"] for l in open(sys.argv[2])]
assert len(b) == len(f) == 10
worst = max(abs(x - y) / y for x, y in zip(b, f))
assert 0 < worst < 0.02, worst
print(f"worst step {worst:.3%}")
EOF2
  ); then echo "ok   $prec plan on 8 ranks tracks the fp32 curve: $msg"; else fail "$prec plan: $msg"; fi
done

# Resume from sharded checkpoints: stop after step 5, resume, and the curve goes on as the
# uninterrupted run's.
checks=$((checks + 1))
plan="$tmp/pp2_1f1b.plan"
if "${mpirun[@]}" -np 2 "$cleave" train "$plan" --data "$corpus" "${common[@]}" --checkpoint-dir "$tmp/ck" \
     --checkpoint-every 5 --exit-at 5 --metrics "$tmp/part1.jsonl" >/dev/null 2>&1 &&
   [ -s "$tmp/ck/step_00000005.manifest" ] && [ -s "$tmp/ck/rank_1/step_00000005.ckpt" ] &&
   out=$("${mpirun[@]}" -np 2 "$cleave" train "$plan" --data "$corpus" "${common[@]}" --checkpoint-dir "$tmp/ck" \
           --resume --metrics "$tmp/part2.jsonl" 2>&1) &&
   python3 - "$tmp/part2.rank0.jsonl" "$tmp/pp2_1f1b.rank0.jsonl" <<'EOF'
import json, sys
resumed = [json.loads(l) for l in open(sys.argv[1])]
full = {r["step"]: r for r in map(json.loads, open(sys.argv[2]))}
assert [r["step"] for r in resumed] == list(range(6, 11)), [r["step"] for r in resumed]
for r in resumed:
    assert abs(r["loss"] - full[r["step"]]["loss"]) <= 1e-5 * full[r["step"]]["loss"], (r, full[r["step"]])
EOF
then echo "ok   resume on the same mesh continues the uninterrupted loss curve (steps 6-10)"
else fail "resume: ${out:-}"; fi

# Resume on another mesh: saved at dp=2 x pp=2 x tp=2 with ZeRO-1 (8 ranks) after step 5, then
# at tp=2 (2 ranks); and saved at tp=2, then at dp=2 with ZeRO-1. Parameters and optimizer
# state are resharded on load and the curve follows the uninterrupted run.
reshard() {  # reshard FROM TO NFROM NTO
  local from="$1" to="$2" nfrom="$3" nto="$4" dir="$tmp/ck_$1_$2"
  checks=$((checks + 1))
  if "${mpirun[@]}" -np "$nfrom" "$cleave" train "$tmp/$from.plan" --data "$corpus" "${common[@]}" \
       --checkpoint-dir "$dir" --checkpoint-every 5 --exit-at 5 >/dev/null 2>&1 &&
     out=$("${mpirun[@]}" -np "$nto" "$cleave" train "$tmp/$to.plan" --data "$corpus" "${common[@]}" \
             --checkpoint-dir "$dir" --resume --metrics "$tmp/reshard_$from.jsonl" 2>&1) &&
     [[ "$out" == *"resharded onto"* ]] &&
     python3 - "$tmp/reshard_$from.rank0.jsonl" "$tmp/$to.rank0.jsonl" <<'EOF2'
import json, sys
resumed = [json.loads(l) for l in open(sys.argv[1])]
full = {r["step"]: r for r in map(json.loads, open(sys.argv[2]))}
assert [r["step"] for r in resumed] == list(range(6, 11)), [r["step"] for r in resumed]
for r in resumed:
    assert abs(r["loss"] - full[r["step"]]["loss"]) <= 1e-5 * full[r["step"]]["loss"], (r, full[r["step"]])
EOF2
  then echo "ok   saved under $from ($nfrom ranks), resumed under $to ($nto ranks): steps 6-10 follow the uninterrupted run"
  else fail "reshard $from -> $to: ${out:-}"; fi
}
reshard dp2pp2tp2_zero1 tp2 8 2
reshard tp2 dp2_zero1 2 2

# A missing shard: every rank refuses before any step, and nothing is overwritten.
checks=$((checks + 1))
rm "$tmp/ck/rank_1/step_00000010.ckpt"
before=$(md5sum "$tmp/ck/rank_0/step_00000010.ckpt")
out=$(timeout 120 "${mpirun[@]}" -np 2 "$cleave" train "$plan" --data "$corpus" "${common[@]}" --checkpoint-dir "$tmp/ck" \
        --resume 2>&1); rc=$?
if [ $rc -ne 0 ] && [[ "$out" == *"rank 1: "*"step_00000010.ckpt"* ]] && [[ "$out" != *"step  1/"* ]] &&
   [ "$(md5sum "$tmp/ck/rank_0/step_00000010.ckpt")" == "$before" ]; then
  echo "ok   a missing shard stops every rank before training (exit $rc)"
else fail "missing shard (exit $rc): $out"; fi

# Bad launches.
expect_fail() {  # expect_fail "what" "substring" cmd...
  local what="$1" want="$2"; shift 2
  checks=$((checks + 1))
  local start=$SECONDS
  out=$(timeout 120 "$@" 2>&1); rc=$?
  if [ $rc -eq 0 ] || [ $rc -eq 124 ]; then fail "$what: exit $rc"; return; fi
  if [[ "$out" != *"$want"* ]]; then fail "$what: message lacks '$want':"; echo "$out" | tail -5; return; fi
  echo "ok   $what (exit $rc after $((SECONDS - start)) s): $(echo "$out" | grep -m1 "$want")"
}
expect_fail "world size differs from the mesh" "is for mesh tp=2 (2 ranks) and this launch has 3" \
  "${mpirun[@]}" -np 3 "$cleave" train "$tmp/tp2.plan" --data "$corpus" "${common[@]}"
expect_fail "ranks started with different plans" "started with different plans" \
  "${mpirun[@]}" -np 1 "$cleave" train "$tmp/tp2.plan" --data "$corpus" "${common[@]}" : \
  -np 1 "$cleave" train "$tmp/tp2_sp.plan" --data "$corpus" "${common[@]}"
expect_fail "optimizer flags on a plan" "pass them to cleave partition" \
  "${mpirun[@]}" -np 2 "$cleave" train "$tmp/tp2.plan" --data "$corpus" "${common[@]}" --clip 2.0
mkdir -p "$tmp/oldplan" && echo '{"format": "cleave-plan-0"}' > "$tmp/oldplan/plan.json"
expect_fail "a plan of another version" "partition the model again" \
  "${mpirun[@]}" -np 1 "$cleave" train "$tmp/oldplan" --data "$corpus" "${common[@]}"

# Faults: a rank killed with SIGKILL mid-training, and a rank that hangs.
expect_fail "kill -9 of rank 1 at step 3" "exited on signal 9" \
  env CLEAVE_FAULT_KILL=1:3 "${mpirun[@]}" -np 2 "$cleave" train "$tmp/pp2_1f1b.plan" --data "$corpus" \
  "${common[@]}" --comm-timeout 10
expect_fail "a hung rank is reported by the others" "did not complete within 5 s" \
  env CLEAVE_FAULT_HANG=1:3 "${mpirun[@]}" -np 2 "$cleave" train "$tmp/tp2.plan" --data "$corpus" "${common[@]}" \
  --comm-timeout 5

echo "$((checks - fails)) passed, $fails failed"
[ "$checks" -gt 0 ] && [ "$fails" -eq 0 ]
