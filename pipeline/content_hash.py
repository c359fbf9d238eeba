"""The content fingerprint of a local model file or folder (the cell key's weights identity, the GGUF copies' names),
remembered under the pipeline's cache folder; ``models`` re-exports both names."""

from __future__ import annotations

import functools
import hashlib
import os
import tempfile
from pathlib import Path


def cache_root() -> Path:
    """The folder of the pipeline's caches: GGUF conversions, weight fingerprints."""
    return Path(os.environ.get("PIPELINE_CACHE", Path.home() / ".cache" / "pipeline"))


_NOT_WEIGHTS = ("*.md", "metrics.json")  # hidden files and folders are left out too


def _weight_files(root: Path) -> list[Path]:
    """The files of a model folder that make its weights, in name order: symlinked sub-folders followed (a folder
    assembled from links is read like a copied one; a link back to an ancestor is not entered twice); hidden
    files and folders, cards and training records left out."""
    out = []
    for folder, dirs, names in os.walk(root, followlinks=True):
        here = Path(folder)
        ancestors = {os.path.realpath(root / p) for p in here.relative_to(root).parents}
        if here != root and os.path.realpath(here) in ancestors:
            dirs[:] = []  # a link to a folder above it: a cycle
            continue
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        out += [
            here / n
            for n in names
            if not n.startswith(".") and (here / n).is_file() and not any((here / n).match(g) for g in _NOT_WEIGHTS)
        ]
    return sorted(out)


def content_fingerprint(path: str | Path) -> str:
    """sha256 of a local model file or folder's contents (names and bytes of every file but cards and
    training records, in name order): the same weights give the same fingerprint on every machine.

    Remembered by each file's path, size, modification time, change time, device and inode, in this process and
    under the cache folder (``fingerprints/``), so that a 16 GB checkpoint is read once, not at every plan. The
    change time and inode are what a copy cannot restore: ``cp -p``, ``rsync -t`` and ``tar x`` put the old
    modification time back on new bytes of the same size, which a size+mtime stamp took for the old file."""
    root = Path(path)
    files = [root] if root.is_file() else _weight_files(root)
    stamp = tuple(
        (str(p), st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_dev, st.st_ino) for p in files for st in (p.stat(),)
    )
    return _fingerprint(str(root), stamp)


@functools.lru_cache(maxsize=64)
def _fingerprint(root: str, stamp: tuple[tuple[str, int, int, int, int, int], ...]) -> str:
    memo = cache_root() / "fingerprints" / hashlib.sha256(repr((root, stamp)).encode()).hexdigest()[:32]
    try:
        return memo.read_text().strip()
    except OSError:
        pass
    digest = hashlib.sha256()
    for name, *_ in stamp:
        rel = Path(name).relative_to(root).as_posix() if name != root else Path(name).name
        digest.update(rel.encode() + b"\0")
        with open(name, "rb") as fh:
            digest.update(hashlib.file_digest(fh, "sha256").digest())
    found = digest.hexdigest()[:16]
    try:  # written whole or not at all: concurrent planners may race here
        memo.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=memo.parent, delete=False) as tmp:
            tmp.write(found)
        os.replace(tmp.name, memo)
    except OSError:
        pass  # a read-only cache folder: hash again next time
    return found
