#!/usr/bin/env bash
# Communication overlapping compute, measured under mpirun, one process per core, alternating
# runs of the same plan with the overlap (the default) and without:
#   grad-reduce  dp=2: gradient reductions started during the backward, or left in the
#                optimizer step (--no-overlap-grad-reduce);
#   zero2        dp=2 --zero 2: each gradient's reduce-scatter inside the backward, run
#                asynchronously or in line (--no-async-collectives);
#   tp           tp=2: tensor parallelism's AllReduces, asynchronously or in line.
#
# The model is bench/make_pipeline_model.py's GPT (width 128, 8 layers: 1.6M parameters, 6.4 MB
# of fp32 gradients; made with torch when it is installed, else the bundled 4-layer gpt_deep),
# batch 64 x 16 tokens, buckets of BUCKET_MB. Per run: the median ms/step over steps 6..N, the
# communication the step waited for and the reductions' time hidden behind the backward (both
# from the metrics), and the losses, which must be identical.
#
#   bash bench/run_overlap_bench.sh [build/tools/cleave] [steps] [bucket MB] [runs] [grad-reduce|zero2|tp]
set -euo pipefail
cd "$(dirname "$0")/.."
cleave="${1:-build/tools/cleave}"; steps="${2:-40}"; bucket="${3:-1}"; runs="${4:-3}"; what="${5:-grad-reduce}"
case "$what" in
  grad-reduce) mesh=(dp=2); off=(--no-overlap-grad-reduce); labels="overlap the backward|in the optimizer step" ;;
  zero2) mesh=(dp=2 --zero 2); off=(--no-async-collectives); labels="asynchronous|in line" ;;
  tp) mesh=(tp=2); off=(--no-async-collectives); labels="asynchronous|in line" ;;
  *) echo "run_overlap_bench: unknown case '$what' (grad-reduce, zero2, tp)" >&2; exit 2 ;;
esac
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl=self,vader
model=models/train_variants/gpt_deep/model.onnx
if /usr/bin/python3 bench/make_pipeline_model.py "$tmp/model.onnx" >/dev/null 2>&1; then model="$tmp/model.onnx"; fi
echo "model: $model"
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
python3 -c "
import random, struct, sys
random.seed(3)
open(sys.argv[1], 'wb').write(struct.pack('<65536H', *[random.randrange(64) for _ in range(65536)]))
" "$tmp/tokens.bin"
"$cleave" partition "$model" --mesh "${mesh[@]}" --batch 64 --seq 16 --clip 1.0 --bucket-mb "$bucket" -o "$tmp/plan" >/dev/null
for run in $(seq 1 "$runs"); do
  for mode in on off; do
    flag=(); [ "$mode" = off ] && flag=("${off[@]}")
    mpirun --bind-to core -np 2 "$cleave" train "$tmp/plan" --data "$tmp/tokens.bin" --steps "$steps" --threads 1 \
      --plot none --log-every 0 --val-fraction 0 --metrics "$tmp/m_${mode}_$run.jsonl" "${flag[@]}" >/dev/null
  done
done
python3 - "$tmp" "$runs" "$bucket" "${mesh[*]}" "$labels" <<'PYEOF'
import json, statistics, sys
tmp, runs, bucket, mesh, labels = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5].split("|")
def load(mode, run):
    return [[json.loads(l) for l in open(f"{tmp}/m_{mode}_{run}.rank{r}.jsonl")] for r in range(2)]
rows = {}
for mode in ("on", "off"):
    ms, comm, hidden = [], [], []
    for run in range(1, runs + 1):
        ranks = load(mode, run)
        steps = list(zip(*ranks))[5:]
        ms += [max(x["ms"] for x in st) for st in steps]
        comm += [statistics.mean(x["comm_ms"] for x in st) for st in steps]
        hidden += [statistics.mean(x["overlapped_comm_ms"] for x in st) for st in steps]
    rows[mode] = (statistics.median(ms), statistics.median(comm), statistics.median(hidden))
on_losses = [x["loss"] for x in load("on", 1)[0]]
off_losses = [x["loss"] for x in load("off", 1)[0]]
print(f"{mesh}, buckets of {bucket} MB, {runs} runs of each, steps 6.. (median):")
print(f"| communication | ms/step | comm waited ms | comm hidden ms |")
print(f"|---|---|---|---|")
for mode, label in zip(("on", "off"), labels):
    m, c, h = rows[mode]
    print(f"| {label} | {m:.2f} | {c:.2f} | {h:.2f} |")
print(f"speed-up {rows['off'][0] / rows['on'][0]:.3f}x; losses identical: {on_losses == off_losses}")
PYEOF
