#!/usr/bin/env bash
# The demo: installs dependencies, builds, then shows cleave on the bundled tiny GPT:
# what the model holds, a run whose logits are checked against PyTorch's, a picture of the
# optimised graph, 200 training steps on the bundled text corpus with a loss curve, then the
# same model partitioned for dp=2 x pp=2 x tp=2, trained by mpirun on 8 CPU ranks, and its plan
# inspected and drawn.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/build.sh
M=models/tiny_gpt
echo "== cleave inspect $M/model.onnx"
build/tools/cleave inspect $M/model.onnx
echo
echo "== cleave run (logits checked against the PyTorch golden file)"
mkdir -p out/demo
build/tools/cleave run $M/model.onnx --input input_ids=$M/test_data_set_0/input_0.pb \
  --output-dir out/demo --check $M/test_data_set_0 --atol 1e-4
echo
echo "== the graph cleave runs after folding and fusion, drawn with Graphviz"
build/tools/cleave inspect $M/model.onnx --optimized --dot out/demo/tiny_gpt.dot | tail -n 3
dot -Tsvg out/demo/tiny_gpt.dot -o out/demo/tiny_gpt.svg
echo "picture: out/demo/tiny_gpt.svg"
echo
echo "== cleave train: 200 AdamW steps on models/tiny_gpt/corpus.txt (loss starts near ln 256 = 5.55)"
build/tools/cleave train $M/model.onnx --data $M/corpus.txt --batch 16 --seq 64 --steps 200 \
  --lr 3e-3 --warmup 20 --lr-schedule cosine --clip 1.0 --weight-decay 0.1 --val-fraction 0.1 \
  --eval-every 50 --log-every 20 --metrics out/demo/train_metrics.jsonl \
  --checkpoint-dir out/demo/checkpoints --checkpoint-every 100 --save-model out/demo/tiny_gpt_trained.onnx
echo "metrics: out/demo/train_metrics.jsonl, loss curve: out/demo/train_metrics.png"
echo
echo "== cleave partition for dp=2 x pp=2 x tp=2 (1F1B over 4 micro-batches, ZeRO-1), then mpirun on 8 ranks"
build/tools/cleave partition $M/model.onnx --mesh dp=2,pp=2,tp=2 --batch 16 --seq 64 --microbatches 4 \
  --zero 1 --clip 1.0 --weight-decay 0.1 -o out/demo/plan
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mpirun --oversubscribe --bind-to none -np 8 build/tools/cleave train out/demo/plan --data $M/corpus.txt \
  --steps 100 --lr 3e-3 --warmup 10 --log-every 20 --eval-every 50 --threads 1 \
  --metrics out/demo/plan_metrics.jsonl
echo
echo "== cleave inspect of the plan (rank 0), with its first stage drawn"
build/tools/cleave inspect out/demo/plan --rank 0 --svg out/demo/plan_rank0.svg
echo
echo "outputs written to out/demo/"
