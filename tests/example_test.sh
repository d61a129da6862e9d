#!/usr/bin/env bash
# The C++ application example (examples/train_plan.cc): built by the default build, run under
# mpirun on a tp=2 plan (the loss falls, every rank saves its shard), and built again on its
# own against an installed cleave (cmake --install + find_package(cleave)).
set -uo pipefail
cleave="$1"; example="$2"; src="$3"; build="$4"
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl=self,vader
fails=0; checks=0
fail() { echo "FAIL $*"; fails=$((fails + 1)); }

checks=$((checks + 1))
"$cleave" partition "$src/models/tiny_gpt/model.onnx" --mesh tp=2 --batch 4 --seq 64 -o "$tmp/plan" >/dev/null
if out=$(timeout 300 mpirun --oversubscribe --bind-to none -np 2 "$example" "$tmp/plan" \
           "$src/models/tiny_gpt/corpus.txt" 12 "$tmp/ck" 2>&1) &&
   [ -s "$tmp/ck/rank_0.ckpt" ] && [ -s "$tmp/ck/rank_1.ckpt" ] &&
   python3 -c "
import re, sys
losses = [float(x) for x in re.findall(r'loss ([0-9.]+)', sys.argv[1])]
assert len(losses) == 12 and losses[-1] < losses[0] - 0.3, losses
" "$out"; then
  echo "ok   train_plan on 2 ranks: $(echo "$out" | grep -m1 'step 1:') ... $(echo "$out" | grep 'step 12:')"
else
  fail "train_plan: $out"
fi

checks=$((checks + 1))
if cmake --install "$build" --prefix "$tmp/prefix" >"$tmp/install.log" 2>&1 &&
   cmake -S "$src/examples" -B "$tmp/app" -DCMAKE_PREFIX_PATH="$tmp/prefix" >"$tmp/app.log" 2>&1 &&
   cmake --build "$tmp/app" -j2 >>"$tmp/app.log" 2>&1 && [ -x "$tmp/app/train_plan" ]; then
  echo "ok   an application built against the installed package (find_package(cleave))"
else
  fail "install + find_package build:"; tail -20 "$tmp/install.log" "$tmp/app.log"
fi
echo "$((checks - fails)) passed, $fails failed"
[ "$fails" -eq 0 ]
