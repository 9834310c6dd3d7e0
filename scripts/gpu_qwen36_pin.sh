#!/usr/bin/env bash
# On a GPU host: record the real Qwen/Qwen3.6-35B-A3B pin with vLLM, then gate the HF engine
# (transformers, the reference implementation) against it. Everything lands under one folder.
#
#   bash scripts/gpu_qwen36_pin.sh [OUT]          # default OUT: gpu-qwen36-<UTC time>
#
# Needs: gate installed with a CUDA vLLM that supports qwen3_5_moe (`pip install 'gate-llm[vllm,hf]'`),
# the model's weights reachable (the Hugging Face hub, or HF_HUB_OFFLINE=1 with them cached), and
# about 70 GB of GPU memory per copy of the bf16 weights: one 141 GB H200 (TP=1, the default
# here) or two 80 GB GPUs (TP=2). Each step has its own timeout; a step that fails stops the
# script with its log named. Environment: TP, PIN_TIMEOUT_S (default 5400), RUN_TIMEOUT_S
# (default 5400), GATE (default: gate).
#
# Outputs in OUT: pins/Qwen/Qwen3.6-35B-A3B/ (the pin folder: oracle.json, suite.jsonl,
# pin.jsonl), pin-record.log, pin-show.json, run-hf.json, run-hf.md, candidate-hf.jsonl, run-hf.log,
# gpus.csv, SHA256SUMS.
# Commit the pin folder into oracle_pins/ when pin.jsonl fits the repository; else commit
# pin-show.json and SHA256SUMS, and keep the pin where CI can fetch it.
set -euo pipefail

MODEL="Qwen/Qwen3.6-35B-A3B"
OUT="${1:-gpu-qwen36-$(date -u +%Y%m%dT%H%M%SZ)}"
TP="${TP:-1}"
GATE="${GATE:-gate}"
PIN_TIMEOUT_S="${PIN_TIMEOUT_S:-5400}"
RUN_TIMEOUT_S="${RUN_TIMEOUT_S:-5400}"
here="$(cd "$(dirname "$0")/.." && pwd)"

if [ -e "$OUT" ]; then
  echo "gpu_qwen36_pin: $OUT exists; give another folder" >&2
  exit 2
fi
command -v nvidia-smi >/dev/null || { echo "gpu_qwen36_pin: no nvidia-smi: this script is for a GPU host" >&2; exit 3; }
mkdir -p "$OUT/pins/Qwen"
cp -r "$here/oracle_pins/Qwen/Qwen3.6-35B-A3B" "$OUT/pins/Qwen/"
rm -f "$OUT/pins/Qwen/Qwen3.6-35B-A3B/pin.jsonl"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv >"$OUT/gpus.csv"

step() {  # step NAME TIMEOUT_S COMMAND...: run with a timeout, its stderr in OUT/NAME.log
  local name="$1" limit="$2"
  shift 2
  echo "gpu_qwen36_pin: $name ($*)" >&2
  if ! timeout --kill-after=60 "$limit" "$@" 2>"$OUT/$name.log"; then
    echo "gpu_qwen36_pin: $name failed or timed out after ${limit}s; see $OUT/$name.log:" >&2
    tail -5 "$OUT/$name.log" >&2
    exit 3
  fi
}

# 1. The pin, by vLLM in bf16 (oracle.json's settings; TP overrides its tensor_parallel_size).
step pin-record "$PIN_TIMEOUT_S" "$GATE" pin record --model "$MODEL" --pins-dir "$OUT/pins" \
  --oracle vllm --engine-opt "tensor_parallel_size=$TP"
"$GATE" pin show --model "$MODEL" --pins-dir "$OUT/pins" >"$OUT/pin-show.json"

# 2. The HF engine (transformers, bf16, on the GPU) gated against it: JSON and Markdown reports.
#    Exit 1 (the gate failed) is a result, not a failure of the script.
set +e
timeout --kill-after=60 "$RUN_TIMEOUT_S" "$GATE" run --model "$MODEL" --pins-dir "$OUT/pins" --engine hf \
  --engine-opt device=cuda --engine-opt dtype=bfloat16 --format json --output "$OUT/run-hf.json" \
  --save-trace "$OUT/candidate-hf.jsonl" 2>"$OUT/run-hf.log"
rc=$?
set -e
if [ "$rc" -gt 1 ]; then
  echo "gpu_qwen36_pin: gate run failed (exit $rc); see $OUT/run-hf.log" >&2
  tail -5 "$OUT/run-hf.log" >&2
  exit "$rc"
fi
# The same verdict as Markdown, from the saved candidate trace (no model is loaded again).
"$GATE" run --model "$MODEL" --pins-dir "$OUT/pins" --candidate-trace "$OUT/candidate-hf.jsonl" \
  --format markdown --output "$OUT/run-hf.md" 2>>"$OUT/run-hf.log" || true
(cd "$OUT" && find . -type f ! -name SHA256SUMS -print0 | sort -z | xargs -0 sha256sum >SHA256SUMS)
echo "gpu_qwen36_pin: done (gate run exit $rc); outputs in $OUT" >&2
