#!/usr/bin/env bash
# The cleave CLI on good and bad input: inspect output, and for each bad input a non-zero
# exit with a message naming the file, node or tensor and what was expected.
set -uo pipefail
cleave="$1"; src="$2"
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
fails=0; checks=0
model="$src/models/tiny_gpt/model.onnx"

expect_fail() {  # expect_fail "description" "substring" cmd...
  local what="$1" want="$2"; shift 2
  checks=$((checks + 1))
  out=$("$@" 2>&1); rc=$?
  if [ $rc -eq 0 ]; then echo "FAIL $what: exit 0"; fails=$((fails + 1)); return; fi
  if [[ "$out" != *"$want"* ]]; then
    echo "FAIL $what: message lacks '$want':"; echo "$out" | head -5; fails=$((fails + 1)); return
  fi
  echo "ok   $what (exit $rc): $(echo "$out" | head -1)"
}
expect_ok() {  # expect_ok "description" "substring" cmd...
  local what="$1" want="$2"; shift 2
  checks=$((checks + 1))
  out=$("$@" 2>&1); rc=$?
  if [ $rc -ne 0 ] || [[ "$out" != *"$want"* ]]; then
    echo "FAIL $what (exit $rc):"; echo "$out" | head -5; fails=$((fails + 1)); return
  fi
  echo "ok   $what"
}

expect_ok "inspect lists parameters" "parameters:" "$cleave" inspect "$model"
expect_ok "inspect lists opsets" "ai.onnx=17" "$cleave" inspect "$model"
expect_ok "inspect --optimized shows fused ops" "ai.cleave.FusedMatMul" "$cleave" inspect "$model" --optimized
expect_ok "inspect --dot writes a picture" "graph picture" "$cleave" inspect "$model" --optimized --dot "$tmp/g.dot"
expect_ok "the picture is Graphviz with the fused ops" "ai.cleave.FusedMatMul" cat "$tmp/g.dot"
expect_ok "Graphviz renders it" "<svg" dot -Tsvg "$tmp/g.dot"

# The backend-test runner on a chosen device: auto runs where it can (the CPU here without a GPU);
# cuda without one is one clear error, not a failure per test.
expect_ok "conformance --device auto" "1 passed, 0 failed" \
  "$cleave" conformance "$src/models/variants/gpt_opset14" --device auto --quiet
expect_fail "conformance --device of no such kind" "--device expects cpu, cuda or auto, got 'tpu'" \
  "$cleave" conformance "$src/models/variants/gpt_opset14" --device tpu
if ! command -v nvidia-smi >/dev/null 2>&1; then
  expect_fail "conformance --device cuda without a GPU" "the session asks for CUDA: CUDA unavailable" \
    "$cleave" conformance "$src/models/variants" --device cuda
fi

data="$src/models/tiny_gpt/test_data_set_0"
expect_ok "save the optimised graph" "optimised model written" "$cleave" run "$model" \
  --input "input_ids=$data/input_0.pb" --save-optimized "$tmp/optimised.onnx"
expect_ok "optimised graph reproduces the golden logits" "OK" "$cleave" run "$tmp/optimised.onnx" \
  --input "input_ids=$data/input_0.pb" --check "$data" --atol 1e-4
expect_ok "fixed dims fold the shape arithmetic" "OK" "$cleave" run "$model" --dim batch=2 --dim seq=64 \
  --input "input_ids=$data/input_0.pb" --check "$data" --atol 1e-4
expect_fail "fixed dim that contradicts the feed" "dim 1 expected 32, got 64" "$cleave" run "$model" \
  --dim seq=32 --input "input_ids=$data/input_0.pb"

# A profiled run: the trace holds every node of every profiled run, and the table counts the
# tiny GPT's 8 fused products per run.
expect_ok "profile writes a trace" "profile of 2 run(s) written" "$cleave" run "$model" \
  --input "input_ids=$data/input_0.pb" --profile "$tmp/profile.json" --profile-runs 2
checks=$((checks + 1))
if python3 - "$tmp/profile.json" <<'PY'
import json, sys
events = [e for e in json.load(open(sys.argv[1]))["traceEvents"] if e["ph"] == "X"]
fused = [e for e in events if e["cat"] == "FusedMatMul"]
assert len(fused) == 16, len(fused)
assert all(e["dur"] >= 0 and e["args"]["provider"] == "CPUExecutionProvider" for e in events)
PY
then echo "ok   the trace has 8 FusedMatMul events per run"
else echo "FAIL the trace's FusedMatMul events"; fails=$((fails + 1)); fi
checks=$((checks + 1))
if grep -Eq "^FusedMatMul +compute +16 " <<<"$out"; then echo "ok   the table counts 16 FusedMatMul calls"
else echo "FAIL the table's FusedMatMul row:"; echo "$out" | head -4; fails=$((fails + 1)); fi
expect_fail "profile into a missing folder" "cannot write the profile '$tmp/no/dir/p.json.tmp'" "$cleave" run \
  "$model" --input "input_ids=$data/input_0.pb" --profile "$tmp/no/dir/p.json"
expect_fail "profile runs must be positive" "--profile-runs expects a positive integer" "$cleave" run "$model" \
  --input "input_ids=$data/input_0.pb" --profile "$tmp/p.json" --profile-runs 0

head -c 3000 "$model" > "$tmp/truncated.onnx"
expect_fail "truncated model" "truncated.onnx" "$cleave" run "$tmp/truncated.onnx"
echo "this is not protobuf at all" > "$tmp/text.onnx"
expect_fail "non-protobuf file" "not a valid ONNX model" "$cleave" run "$tmp/text.onnx"
expect_fail "missing model" "cannot open model file" "$cleave" run "$tmp/absent.onnx"
expect_fail "unknown command" "unknown command" "$cleave" frobnicate

# An unsupported op: every unsupported node is listed.
tfidf=/usr/share/libonnx-testdata/data/node/test_tfidfvectorizer_tf_onlybigrams_skip5/model.onnx
expect_fail "unsupported op" "TfIdfVectorizer 'TfIdfVectorizer_0': unsupported op TfIdfVectorizer" "$cleave" run "$tfidf"

# Wrong dtype and wrong shape at run time.
python3 - "$tmp" <<'PY'
import sys, numpy as np
from onnx import numpy_helper
d = sys.argv[1]
open(f"{d}/float_ids.pb", "wb").write(numpy_helper.from_array(np.zeros((2, 64), np.float32), "input_ids").SerializeToString())
open(f"{d}/rank3.pb", "wb").write(numpy_helper.from_array(np.zeros((2, 64, 1), np.int64), "input_ids").SerializeToString())
PY
expect_fail "wrong input dtype" "expected dtype int64, got float32" "$cleave" run "$model" --input "input_ids=$tmp/float_ids.pb"
expect_fail "wrong input rank" "input 'input_ids'" "$cleave" run "$model" --input "input_ids=$tmp/rank3.pb"
expect_fail "missing input file" "absent.pb" "$cleave" run "$model" --input "input_ids=$tmp/absent.pb"

# Missing external data file.
python3 - "$tmp" <<'PY'
import sys, onnx
from onnx import helper, TensorProto, numpy_helper
import numpy as np
d = sys.argv[1]
w = numpy_helper.from_array(np.ones((64, 64), np.float32), "w")
g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")], "g",
                      [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64])], [w])
m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
onnx.save_model(m, f"{d}/ext.onnx", save_as_external_data=True, all_tensors_to_one_file=True,
                location="ext.weights", size_threshold=0)
PY
rm -f "$tmp/ext.weights"
expect_fail "missing external data" "ext.weights" "$cleave" run "$tmp/ext.onnx"

echo "$((checks - fails)) passed, $fails failed"
[ $fails -eq 0 ]
