#!/usr/bin/env bash
# Here, after the GPU calls of jobs/gpu_teacher.sh: unpack the teacher bundles they returned, retrain the draft on
# them (`python -m pipeline.distill data.teacher_dir=...`: the held-out sets are built here from the target as served
# here, no teacher data is generated), then measure the held-out alpha (`pipeline.training.drafter_alpha`) and check it
# against issue 46's goal (alpha >= 0.5).
#   bash jobs/teacher_back.sh FOLDER_OR_TAR... [-- distill overrides...]
# FOLDER_OR_TAR: teacher-NN.tar bundles, or folders holding them (every device call's files_at): untrusted, unpacked
# by `python -m pipeline.training.gpu_teacher unpack` (only regular shard-NNNN.npz and manifest.json members; a bundle
# with anything else, a bad hash or a bad record is refused, exit 2, nothing moved). distill then refuses the folder
# while a shard its manifest lists is missing (collect and pass the other bundles too). Environment:
# PY (python), RUN (the run's folder, default .cache/distill/gpu-teacher: data/ holds the unpacked shards, the draft
# goes to $RUN/draft unless out_dir= is given), GOAL (default 0.5).
# Rehearsed on a CPU with a tiny run: ... -- train.steps=4 train.eval_every=2 heldout.n_humaneval=2 heldout.n_mtbench=2
# heldout.n_chat=2 heldout.max_new_tokens=16 measure_cost=false (benchmarks/cpu-rehearsal-gpu-teacher.md).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
RUN=${RUN:-.cache/distill/gpu-teacher}
GOAL=${GOAL:-0.5}
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONPATH=${PYTHONPATH:-$PWD}
SOURCES=()
while [ $# -gt 0 ] && [ "$1" != -- ]; do SOURCES+=("$1"); shift; done
[ "${1:-}" = -- ] && shift
[ ${#SOURCES[@]} -gt 0 ] || { echo "usage: bash jobs/teacher_back.sh FOLDER_OR_TAR... [-- distill overrides]" >&2; exit 2; }
# the bundles come from another machine: gpu_teacher unpack takes only their regular shard-NNNN.npz and
# manifest.json members, each bundle into a fresh folder, checks hashes and records, then moves them into place
"$PY" -m pipeline.training.gpu_teacher unpack --into "$RUN/data" "${SOURCES[@]}" || exit $?
# the settings the chat mix's train split was drawn with (distill refuses others: check_teacher_dir)
read -r PROMPTS N SEED MULTI < <("$PY" -c "import json, sys; m = json.load(open(sys.argv[1]))['settings']; print(m['prompts'], m['n_prompts'], m['seed'], m['multi_turn'])" "$RUN/data/manifest.json")
echo "teacher data settings: prompts=$PROMPTS n_prompts=$N seed=$SEED multi_turn=$MULTI"
"$PY" -m pipeline.distill data.teacher_dir="$RUN/data" data.prompts="$PROMPTS" data.n_prompts="$N" seed="$SEED" \
  data.multi_turn="$MULTI" work_dir="$RUN" out_dir="$RUN/draft" heldout.n_chat=48 progress=false "$@"
DRAFT=$("$PY" -c "import json, sys; print(json.load(open(sys.argv[1]))['config']['out_dir'])" "$RUN/metrics.json" 2>/dev/null || true)
for arg in "$@"; do case "$arg" in out_dir=*) DRAFT=${arg#out_dir=} ;; esac; done
DRAFT=${DRAFT:-$RUN/draft}
"$PY" -m pipeline.training.drafter_alpha --work "$RUN" --draft "$DRAFT" --out "$RUN/alpha.json"
"$PY" - "$RUN/alpha.json" "$GOAL" <<'EOF'
import json, sys
res, goal = json.load(open(sys.argv[1])), float(sys.argv[2])
for name, figures in res.items():  # one held-out set each: heldout-he..-mt.. (HumanEval + MT-Bench), heldout-chat..
    a = figures["model"]
    print(f"{name}: draft alpha {a:.4f} over {figures['positions']} positions ({'meets' if a >= goal else 'below'} the goal {goal})")
EOF
