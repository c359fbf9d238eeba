"""Locks of local stores: the store's creation lock and the per-cell and per-parent leases of drivers.

Drivers sharing a local store (sqlite file or file store) coordinate through lock files beside it
(``<store>.locks/``): a driver holds an exclusive ``flock`` on ``cell-<key>.lock`` while it runs and
logs that cell, and on ``parent-<run id>.lock`` while its parent run is open; the kernel drops the
locks when the driver dies, so a lease never outlives its driver. The first MLflow connection
(schema creation/migration) and experiment creation run under ``<store>.lock``.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import threading
import time
from pathlib import Path
from typing import Any, Iterator

from pipeline.tracking.store import local_store_path


@contextlib.contextmanager
def store_lock(uri: str) -> Iterator[None]:
    """Exclusive lock around store creation / schema migration for local stores (no-op for remote ones)."""
    path = local_store_path(uri)
    if path is None:
        yield
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    lock = path.parent / (path.name + ".lock")
    with open(lock, "a+") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


class FileLeases:
    """Exclusive non-blocking ``flock`` leases in a folder, one file per name; dropped by the kernel at exit."""

    def __init__(self, folder: Path):
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self._held: dict[str, Any] = {}
        self._mutex = threading.Lock()

    def _path(self, name: str) -> Path:
        return self.folder / f"{name}.lock"

    def try_acquire(self, name: str) -> bool:
        """True when this process now holds ``name`` (or already did)."""
        with self._mutex:
            if name in self._held:
                return True
            fh = open(self._path(name), "a+")
            try:
                fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                fh.close()
                return False
            fh.seek(0)
            fh.truncate()
            fh.write(json.dumps({"pid": os.getpid(), "host": os.uname().nodename, "since": time.time()}))
            fh.flush()
            self._held[name] = fh
            return True

    def release(self, name: str) -> None:
        with self._mutex:
            fh = self._held.pop(name, None)
        if fh is not None:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)
            fh.close()

    def held_elsewhere(self, name: str) -> bool:
        """True when another live process holds ``name``."""
        if name in self._held:
            return False
        if not self.try_acquire(name):
            return True
        self.release(name)
        return False

    def release_all(self) -> None:
        for name in list(self._held):
            self.release(name)
