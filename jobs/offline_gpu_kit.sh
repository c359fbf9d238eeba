#!/usr/bin/env bash
# What a GPU node without PyPI or Hub access needs, beyond a CUDA PyTorch image that already has
# transformers, pytest and nvidia-ml-py, to run the engine's CUDA tests, `python -m pipeline.bench` on
# the random-weight pair (conf/pair/random-llama3-8b-1b.yaml) and our energy meter against Zeus's:
#
#   bash jobs/offline_gpu_kit.sh [KIT_DIR] [PYTHON_VERSION]      # here, with PyPI (default .kit, 3.12)
#
# KIT_DIR gets wheels/ (hydra-core, omegaconf, antlr4 built here from its sdist, zeus and its needs but
# amdsmi, pydantic among them; gguf) and tokenizer.tgz (the offline pair's tokenizer, 0.6 MB, instead of its
# 98 MB GGUF: the random pair takes only its tokenizer from it), the sweep's wheels (Ray, MLflow and their needs) and
# parts/ (all of it as one tar in PART_MIB-MiB parts, default 32, for device calls: jobs/gpu_sweep.sh); SWEEP=0 stops
# before the sweep's wheels and the parts (what jobs/gpu_check.sh carries). The commands to run on the node are in jobs/README.md
# (*A GPU node without internet*). What cannot travel this way, and why, is said there too.
set -euo pipefail
cd "$(dirname "$0")/.."
KIT=${1:-.kit}
PYV=${2:-3.12}
PY=${PY:-.venv/bin/python}
LOCK=requirements.lock
pin() { grep -i "^$1==" "$LOCK" || { echo "no pin for $1 in $LOCK" >&2; exit 1; }; }

rm -rf "$KIT" && mkdir -p "$KIT/wheels"
# never carried as untracked files of the tree (a device call carries only the parts it names)
EXCLUDE=$(git rev-parse --git-common-dir 2>/dev/null)/info/exclude  # a worktree's .git is a file
[ -d "$(dirname "$EXCLUDE")" ] && { grep -qx "/$KIT/" "$EXCLUDE" || echo "/$KIT/" >> "$EXCLUDE"; }
# pure-Python wheels, the versions requirements.lock pins; antlr4's 4.9.3 (what omegaconf 2.3 needs) is an sdist only
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version "$PYV" --implementation py \
  -d "$KIT/wheels" "$(pin hydra-core)" "$(pin omegaconf)" "$(pin tyro)" "$(pin docstring_parser)" "$(pin typeguard)" \
  "$(pin httpx)" "$(pin httpcore)" zeus==0.16.0
"$PY" -m pip wheel -q --no-deps -w "$KIT/wheels" "$(pin antlr4-python3-runtime)"
# Zeus imports pydantic, which the GPU image lacks (seen on an H200 image, 2026-11-26): pydantic's compiled core for
# that Python, its pure-Python needs, and gguf (the offline pair's loader, when its GGUF travels too)
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version "$PYV" --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d "$KIT/wheels" "$(pin pydantic_core)"
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version "$PYV" --implementation py \
  -d "$KIT/wheels" "$(pin pydantic)" "$(pin annotated-types)" "$(pin typing-inspection)" "$(pin typing_extensions)" \
  "$(pin gguf)"

# the offline pair's tokenizer as a plain folder (what conf/pair/random-llama3-8b-1b.yaml's `tokenizer:` reads)
HF_HUB_OFFLINE=1 "$PY" - "$KIT" <<'EOF'
import sys, tarfile, tempfile
from pathlib import Path
from pipeline.models import load_tokenizer, pair_config, ModelSpec
spec = ModelSpec.from_config(pair_config("random-llama3-8b-1b")["target"]["tokenizer"])
with tempfile.TemporaryDirectory() as tmp:
    load_tokenizer(spec).save_pretrained(Path(tmp) / "tokenizer")
    with tarfile.open(Path(sys.argv[1]) / "tokenizer.tgz", "w:gz") as tar:
        tar.add(Path(tmp) / "tokenizer", arcname="tokenizer")
EOF

# SWEEP=0: no more (the device check, jobs/gpu_check.sh, carries .kit/wheels and tokenizer.tgz as they are)
if [ "${SWEEP:-1}" = 0 ]; then ls -l "$KIT"/wheels "$KIT"/tokenizer.tgz; du -sb "$KIT"/wheels "$KIT"/tokenizer.tgz; exit 0; fi

# The sweep (`python -m pipeline.sweep`, jobs/gpu_sweep.sh): Ray, MLflow (skinny: the client and the SQLite store) and
# what they need that the GPU image lacks. The list is the closure of ray, mlflow-skinny, SQLAlchemy and alembic at
# requirements.lock's versions, less the image's packages (/work/.library/device/KINDS.md, 2026-11-17), computed
# with importlib.metadata on 2026-11-28; pydantic and hydra/omegaconf come from the lines above.
SWEEP_WHEELS="alembic annotated-types cachetools cffi cryptography databricks-sdk fastapi gitdb GitPython google-auth
  importlib_metadata jsonschema jsonschema-specifications Mako mlflow-skinny opentelemetry-api opentelemetry-proto
  opentelemetry-sdk opentelemetry-semantic-conventions pyasn1 pyasn1_modules pycparser python-dotenv ray referencing
  rpds-py smmap SQLAlchemy sqlparse starlette uvicorn zipp"
PINS=(); for name in $SWEEP_WHEELS; do PINS+=("$(pin "$name")"); done
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version "$PYV" --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform any \
  -d "$KIT/wheels" "${PINS[@]}"

# Parts that ride beside the tracked tree (about 30 MB) in one device call each (64 MiB in all): one tar of the
# wheels and the tokenizer, split; jobs/gpu_sweep.sh keeps each carried part in /tmp/kit and joins them there.
PART_MIB=${PART_MIB:-33}
rm -rf "$KIT/parts" && mkdir -p "$KIT/parts"
tar cf - -C "$KIT" wheels tokenizer.tgz | split -b "${PART_MIB}M" - "$KIT/parts/kit.tar.part-"
(cd "$KIT/parts" && sha256sum kit.tar.part-* > SHA256)
ls -l "$KIT"/wheels "$KIT"/tokenizer.tgz "$KIT"/parts
du -sh "$KIT" "$KIT/parts"
