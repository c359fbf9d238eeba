#!/usr/bin/env bash
# One device session's checks, in the order that matters if time runs out (each step bounded, each result written
# as it comes): the step profile, the bench against transformers with our energy meter against Zeus's, the same
# rows with CUDA graphs (PIPELINE_CUDA_GRAPHS=1), the batch-size table, then the engine's CUDA tests. Prepared here with `bash jobs/offline_gpu_kit.sh .kit`; run on the
# GPU machine from the project folder with .kit carried in:
#   OUT=/tmp/out bash jobs/gpu_session.sh [PAIR] [extra overrides...]      (PAIR default random-llama3-8b-1b)
# Rehearse on a CPU with a small random pair: PY=.venv/bin/python METER=none and the pair's shapes shrunk by
# overrides (pair.target.config.num_hidden_layers=2 ..., the same for the draft).
set -uo pipefail
OUT=${OUT:-/tmp/gpu-out}; mkdir -p "$OUT"
PAIR=${1:-random-llama3-8b-1b}; shift || true
PY=${PY:-python3}
NAME=${NAME:-gpu-$PAIR}
if [ -d .kit/wheels ] && ! "$PY" -c "import hydra, zeus" 2>/dev/null; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .kit/wheels/*.whl && export PYTHONPATH=/tmp/site:$PWD
fi
export PYTHONPATH=${PYTHONPATH:-$PWD} HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
[ -f .kit/tokenizer.tgz ] && tar xzf .kit/tokenizer.tgz -C /tmp
T=/tmp/tokenizer
TOK=()
[ -d "$T" ] && for role in target draft; do
  TOK+=("~pair.$role.tokenizer.package" "~pair.$role.tokenizer.gguf_file" "pair.$role.tokenizer.id=$T")
done
ARGS=(pair="$PAIR" "${TOK[@]}" "$@")
METER=${METER:-nvml+zeus}
STEPS=${STEPS:-profile bench bench_graphs batched cuda_tests}
# two of conf/bench.yaml's prompts, 32 new tokens, greedy: sized from the H200's step costs of 2026-11-26 (8B target
# 16 ms, 1B draft 7.5 ms per step, both bound by the host's kernel launches; benchmarks/gpu-random-llama3-8b-1b.md),
# where three prompts in both modes did not finish in 220 s
PROMPTS=${PROMPTS:-'prompts=["Write a Python function that checks whether a string is a palindrome.","Explain in two sentences why the sky is blue."]'}
step() {  # step NAME SECONDS CMD...: bounded, logged to $OUT/NAME.log, never stops the script; only those in $STEPS
  local name=$1 secs=$2; shift 2
  case " $STEPS " in *" $name "*) ;; *) return 0 ;; esac
  echo "=== $name ($(date -u +%T), limit ${secs}s)"
  timeout -k 5 "$secs" "$@" >"$OUT/$name.log" 2>&1; local rc=$?
  echo "=== $name rc=$rc ($(date -u +%T))"; tail -n 40 "$OUT/$name.log"
}
{ nvidia-smi --query-gpu=name,driver_version,memory.total,power.limit --format=csv 2>&1
  "$PY" -c "import torch, transformers, sys; print(sys.version.split()[0], torch.__version__, transformers.__version__, torch.cuda.is_available())"
  "$PY" -c "import hydra, zeus.monitor, pydantic; print('hydra', hydra.__version__, 'zeus ok, pydantic', pydantic.VERSION)"
} >"$OUT/env.log" 2>&1; cat "$OUT/env.log"
step profile "${T_PROFILE:-120}" "$PY" -m pipeline.bench.profile "${ARGS[@]}" "$PROMPTS" gamma=4 probe_reps=5 name="$NAME" out_dir="$OUT"
step bench "${T_BENCH:-300}" "$PY" -m pipeline.bench "${ARGS[@]}" "$PROMPTS" max_new_tokens="${TOKENS:-32}" gamma=4 energy_meter="$METER" name="$NAME" out_dir="$OUT" \
  "methods=${METHODS:-[ar,spd,block,mtad,typical,specinfer,hsd]}" "modes=${MODES:-[greedy]}" \
  repeats="${REPEATS:-2}" warmup=1 probe_reps=5 idle_seconds=5
# the same rows with the short steps replayed as CUDA graphs (decoding/cuda_graphs.py), beside the eager table
step bench_graphs "${T_GRAPHS:-150}" env PIPELINE_CUDA_GRAPHS=1 "$PY" -m pipeline.bench "${ARGS[@]}" "$PROMPTS" \
  max_new_tokens="${TOKENS:-32}" gamma=4 energy_meter="$METER" name="$NAME-cuda-graphs" out_dir="$OUT" \
  "methods=${GRAPH_METHODS:-[ar,spd,block]}" "modes=[greedy]" repeats="${REPEATS:-2}" warmup=1 probe_reps=5 idle_seconds=5
step batched "${T_BATCHED:-150}" "$PY" -m pipeline.bench "${ARGS[@]}" "$PROMPTS" max_new_tokens="${TOKENS:-32}" gamma=4 \
  energy_meter="$METER" idle_seconds=5 name="$NAME" out_dir="$OUT" "methods=${BATCH_METHODS:-[ar,spd]}" "modes=[greedy]" \
  "batch_sizes=${BATCHES:-[1,4,8]}" batch_requests="${BATCH_REQUESTS:-8}" repeats=1 warmup=1
step cuda_tests "${T_TESTS:-150}" "$PY" -m pytest -q -p no:cacheprovider -m gpu $(grep -l "mark.gpu" tests/test_*.py)
ls -la "$OUT"
