#!/usr/bin/env bash
# Pipeline bubble and bytes per step, measured under mpirun against ANCHORS.md's formulas.
#
# A GPT of equal layers (bench/make_pipeline_model.py: width 128, 8 layers, a head of vocab 64,
# made with torch when it is installed; else the bundled 4-layer models/train_variants/gpt_deep)
# over pp=2, one process per core, batch 64 of 16 tokens in M micro-batches, with 1F1B and
# interleaved 1F1B (2 chunks per rank). Per step, the pipeline's makespan runs from the first
# rank's start of its forward and backward work to the last rank's end (the optimizer left
# out; the ranks share the machine's monotonic clock), a rank is busy for its own forward and
# backward time minus its waits in pipeline receives, and the bubble is 1 - sum(busy) / (p x makespan), averaged
# over steps 6..N; the formula is (p-1)/(m+p-1) for 1F1B and (p-1)/(v m + p-1) interleaved. Bytes per step come from plan.json
# (Send/Recv and collectives, training parts once per micro-batch) against the formulas: each
# boundary carries the residual stream [B/m, T, H] fp32 forward and its gradient backward per
# micro-batch, 2 B T H 4 bytes per step; the tied embedding's gradient is all-reduced over the
# two stages that hold it once per step (V H 4 bytes).
#
#   bash bench/run_pipeline_bench.sh [build/tools/cleave] [steps] [micro-batches]
set -euo pipefail
cd "$(dirname "$0")/.."
cleave="${1:-build/tools/cleave}"; steps="${2:-30}"; micro="${3:-8}"
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl=self,vader
model=models/train_variants/gpt_deep/model.onnx
hidden=32
if /usr/bin/python3 bench/make_pipeline_model.py "$tmp/model.onnx" >/dev/null 2>&1; then
  model="$tmp/model.onnx"
  hidden=128
fi
echo "model: $model"
python3 -c "
import random, struct, sys
random.seed(3)
open(sys.argv[1], 'wb').write(struct.pack('<65536H', *[random.randrange(64) for _ in range(65536)]))
" "$tmp/tokens.bin"
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
for sched in "1f1b 1" "interleaved 2"; do
  set -- $sched
  "$cleave" partition "$model" --mesh pp=2 --batch 64 --seq 16 --microbatches "$micro" --schedule "$1" \
    --virtual-stages "$2" -o "$tmp/plan_$1" >/dev/null
  mpirun --bind-to core -np 2 "$cleave" train "$tmp/plan_$1" --data "$tmp/tokens.bin" --steps "$steps" --threads 1 \
    --plot none --log-every 0 --val-fraction 0 --metrics "$tmp/m_$1.jsonl" >/dev/null
  python3 - "$tmp" "$1" "$2" "$micro" "$hidden" <<'EOF'
import json, sys
tmp, kind, v, m, H = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
p = 2
plan = json.load(open(f"{tmp}/plan_{kind}/plan.json"))
# Per step: the pipeline's makespan is the slowest rank's forward + backward time, each rank is
# busy for its time minus its waits in receives, and the bubble is the idle share of
# p x makespan (the simulator's definition).
rows = [[json.loads(l) for l in open(f"{tmp}/m_{kind}.rank{r}.jsonl")][5:] for r in range(p)]
bubbles_per_step = []
for step in zip(*rows):
    # From the first rank's start to the last rank's end, on the machine's monotonic clock.
    makespan = (max(x["pipeline_end_us"] for x in step) - min(x["pipeline_start_us"] for x in step)) / 1000
    busy = sum(x["pipeline_ms"] - x["idle_ms"] for x in step)
    bubbles_per_step.append(1 - busy / (p * makespan))
measured = sum(bubbles_per_step) / len(bubbles_per_step)
bubbles = [sum(x["idle_ms"] for x in rr) / sum(x["pipeline_ms"] for x in rr) for rr in rows]
stage_ms = [sum(x["pipeline_ms"] - x["idle_ms"] for x in rr) / len(rr) for rr in rows]
formula = (p - 1) / (v * m + p - 1)
print(f"{kind:12s} p={p} v={v} m={m}: bubble measured {measured:.3f} (receive waits: rank0 {bubbles[0]:.3f}, "
      f"rank1 {bubbles[1]:.3f}), "
      f"formula {formula:.3f}, ratio {measured / formula:.2f}; busy ms per step by rank "
      f"{stage_ms[0]:.2f} / {stage_ms[1]:.2f} (imbalance {max(stage_ms) / min(stage_ms):.2f}x); "
      f"simulated bubble {plan['schedule']['bubble']:.3f}")
B, T, V = plan["batch"], plan["seq"], plan["vocab"]
r0 = plan["ranks"][0]
p2p = sum(x["bytes_per_step"] for x in r0["p2p"] if x["kind"] == "Send")
boundaries = v * p - 1
total_p2p = sum(x["bytes_per_step"] for rk in plan["ranks"] for x in rk["p2p"] if x["kind"] == "Send")
print(f"{'':12s} Send bytes per step, all ranks: {total_p2p} (formula {boundaries} boundaries x 2 B T H 4 = "
      f"{boundaries * 2 * B * T * H * 4}); tied-embedding AllReduce per rank: "
      f"{sum(c['bytes'] for c in r0['collectives'] if c['reader'] == '(tied parameter)')} (formula V H 4 = {V * H * 4})")
EOF
done
