"""The dequantized copies of GGUF files in the shared cache folder (``pipeline.models`` loads through them).

A GGUF file is converted once into a safetensors copy (``models._gguf_cache_dir`` names its folder by the file's
contents and the transformers version): one process converts under the conversion lock (``cpu_kernels.build_lock``,
whose lock file is never opened through a link) into a private ``<copy>.tmp-*`` folder and moves the files in with
the one readers look for last; the others wait and read the copy. Under the lock, the temporary folders of
conversions that were killed are removed. What can go wrong with the cache itself is a ``ModelCacheError`` naming
the fix (a folder that cannot be written, a full disk, a lock held too long, a copy that does not load), never
"model not available offline" nor a raw ``SafetensorError``; the reader's own errors (the GGUF file cannot be read)
pass through unchanged.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable

from safetensors import SafetensorError

from pipeline.decoding.cpu_kernels import build_lock

TMP_INFIX = ".tmp-"  # <copy>.tmp-XXXX: a conversion's private folder, moved into the copy when complete


class ModelCacheError(ValueError):
    """The cache folder of a model's converted copy cannot be used; the message says why and names the fix."""


class _ReadError(Exception):
    """The source (the GGUF file) could not be read: the caller's error, passed on as it is."""


def move_in(tmp: Path, directory: Path, last: str) -> None:
    """Move the files written in ``tmp`` into ``directory``, ``last`` (the file readers look for) last: a reader
    that finds it finds the rest."""
    directory.mkdir(parents=True, exist_ok=True)
    names = sorted(p.name for p in tmp.iterdir())
    if last not in names:
        raise RuntimeError(f"the conversion wrote no {last} into {tmp}")
    for name in [n for n in names if n != last] + [last]:
        os.replace(tmp / name, directory / name)


def _remove_leftovers(cached: Path) -> None:
    """Under the conversion lock: the temporary folders of this copy's conversions that were killed mid-way."""
    for path in cached.parent.glob(cached.name + TMP_INFIX + "*"):
        if path.is_dir() and not path.is_symlink():
            print(f"pipeline: removing {path}, left by a conversion that was killed", file=sys.stderr, flush=True)
            shutil.rmtree(path, ignore_errors=True)


def ensure_copy(cached: Path, last: str, read: Callable[[], Any], write: Callable[[Any, Path], None]) -> Any:
    """Make the copy's ``last`` file (and what comes with it) exist: ``read()`` the source and ``write(it, tmp)``
    under the conversion lock, unless another process did meanwhile. Returns what ``read`` gave (None when the copy
    was there). ``read``'s own OSError passes through; the cache's errors are a ``ModelCacheError``."""
    if (cached / last).exists():
        return None
    try:
        cached.parent.mkdir(parents=True, exist_ok=True)
        with build_lock(cached.parent / f".{cached.name}.lock", what="the GGUF conversion lock"):
            if (cached / last).exists():  # converted while this one waited
                return None
            _remove_leftovers(cached)
            try:
                source = read()
            except OSError as err:
                raise _ReadError() from err
            with tempfile.TemporaryDirectory(prefix=cached.name + TMP_INFIX, dir=cached.parent) as tmp:
                write(source, Path(tmp))
                move_in(Path(tmp), cached, last)
            return source
    except _ReadError as err:
        raise err.__cause__ from None  # type: ignore[misc]
    except TimeoutError as err:
        raise ModelCacheError(f"the GGUF copy {cached} is not ready: {err}") from None
    except (OSError, SafetensorError) as err:
        raise ModelCacheError(
            f"the GGUF copy {cached} cannot be written ({type(err).__name__}: {_first_line(err)}): make room or "
            f"make {cached.parent} writable, or set PIPELINE_CACHE to a writable folder with room"
        ) from None


def load_copy(load: Callable[[Path], Any], cached: Path) -> Any:
    """``load(cached)``, a copy's unreadable or damaged files (a truncated safetensors, a broken ``config.json``)
    reported as such with the fix."""
    try:
        return load(cached)
    except (OSError, ValueError, SafetensorError) as err:
        raise ModelCacheError(
            f"the GGUF copy {cached} cannot be loaded ({type(err).__name__}: {_first_line(err)}): remove it "
            f"(rm -r {cached}); the next load converts the GGUF file again"
        ) from None


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0][:300] if text else "no message"
