"""Where a sweep's MLflow store is: URIs resolved and checked before Ray starts, and the store's errors."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import sqlite3
import urllib.error
import urllib.request
from pathlib import Path

KNOWN_SCHEMES = ("sqlite", "file", "http", "https", "postgresql", "mysql", "mssql", "databricks")


class TrackingError(ValueError):
    """An unusable tracking URI / store; raised before Ray starts."""


class StoreWriteError(TrackingError):
    """The store stopped accepting writes (or reads) mid-sweep: the driver stops scheduling at once;
    the message says what happened and that the same command resumes."""


def _in_memory_sqlite(uri: str) -> bool:
    """``sqlite://``, ``sqlite:///:memory:`` (and SQLAlchemy's ``file::memory:`` forms): a store that lives and dies
    with one connection; resolved as a relative path it becomes a file named ``:memory:`` in the project."""
    if _scheme(uri) != "sqlite":
        return False
    rest = uri.split("://", 1)[1].split("?", 1)[0]
    return rest in ("", "/") or ":memory:" in rest or "mode=memory" in uri


def resolve_tracking_uri(uri: str, root: Path) -> str:
    """``sqlite:///relative.db`` -> an absolute SQLite path under ``root``; other URIs unchanged.

    An in-memory sqlite URI is refused here (:class:`TrackingError`), before it could be resolved into a file
    named ``:memory:``: the sweep's runs must outlive the driver (resume, the report, the UI)."""
    if _in_memory_sqlite(uri):
        raise TrackingError(
            f"tracking.uri={uri!r}: an in-memory sqlite store is gone when the driver ends (no resume, report "
            "or UI), and resolved as a path it would be a file named ':memory:'; set tracking.uri=sqlite:///mlflow.db "
            "(a local file), or the address of a running `mlflow server`"
        )
    prefix = "sqlite:///"
    if uri.startswith(prefix) and not uri.startswith(prefix + "/"):
        return prefix + str((root / uri[len(prefix) :]).resolve())
    if "://" not in uri:  # a plain folder: the file store
        return str((root / uri).resolve()) if not Path(uri).is_absolute() else uri
    return uri


def _scheme(uri: str) -> str:
    return uri.split("://", 1)[0].split("+", 1)[0].lower() if "://" in uri else ""


def local_store_path(uri: str) -> Path | None:
    """The file (sqlite) or folder (file store) of a local store; None for remote stores."""
    scheme = _scheme(uri)
    if scheme == "sqlite":
        rest = uri[len("sqlite://") :]
        return Path(rest[1:]) if rest.startswith("/") else None  # sqlite:///abs -> /abs ; :memory: -> None
    if scheme == "file":
        return Path(uri[len("file://") :])
    if scheme == "":
        return Path(uri)
    return None


def check_tracking_uri(uri: str, timeout_s: float = 5.0) -> None:
    """Fail fast (seconds, not MLflow's minutes of retries) on a tracking URI that cannot work."""
    scheme = _scheme(uri)
    fix = "set tracking.uri=sqlite:///mlflow.db (a local file), or the address of a running `mlflow server`"
    if scheme not in KNOWN_SCHEMES + ("",):
        raise TrackingError(
            f"tracking.uri={uri!r}: unknown scheme {scheme!r} (valid: {', '.join(KNOWN_SCHEMES)}); {fix}"
        )
    if _in_memory_sqlite(uri):
        resolve_tracking_uri(uri, Path("."))  # raises, with the fix
    path = local_store_path(uri)
    if scheme == "sqlite" and path is None:
        raise TrackingError(
            f"tracking.uri={uri!r}: an in-memory or relative sqlite store cannot be shared with the UI; {fix}"
        )
    if path is not None:
        folder = path.parent if scheme == "sqlite" else path
        while not folder.exists() and folder != folder.parent:
            folder = folder.parent  # the store's folders are created on demand: check the nearest existing one
        if not folder.is_dir():
            raise TrackingError(f"tracking.uri={uri!r}: {folder} is a file, so no store can be created under it; {fix}")
        wanted = path.parent if scheme == "sqlite" else path
        if folder == Path(folder.anchor or "/") and wanted != folder:
            top = Path(folder.anchor or "/") / wanted.relative_to(folder).parts[0]
            hint = (
                (
                    f" (four slashes: the absolute path {path}; a path relative to the project is "
                    f"sqlite:///{path.relative_to(folder)})"
                )
                if scheme == "sqlite"
                else ""
            )
            raise TrackingError(
                f"tracking.uri={uri!r}: the store would create the top-level folder {top}{hint}; "
                f"create the folder first if that is meant, or {fix}"
            )
        if not os.access(folder, os.W_OK):
            raise TrackingError(f"tracking.uri={uri!r}: {folder} is not writable; {fix}")
        if scheme == "sqlite" and path.exists() and path.is_dir():
            raise TrackingError(f"tracking.uri={uri!r}: {path} is a folder, not a sqlite file; {fix}")
        if scheme == "sqlite" and path.is_file() and not os.access(path, os.W_OK):
            raise TrackingError(
                f"tracking.uri={uri!r}: {path} is read-only (the driver writes every cell to it); "
                f"make it writable (chmod u+w) or {fix}"
            )
        if scheme == "sqlite" and path.is_file():
            _check_sqlite_store(uri, path, fix)
        return
    if scheme in ("http", "https"):
        url = uri.rstrip("/") + "/health"
        try:
            with urllib.request.urlopen(url, timeout=timeout_s) as response:
                response.read()
        except urllib.error.HTTPError as err:
            if err.code in (401, 403):
                raise TrackingError(
                    f"tracking server {uri} refused the request (HTTP {err.code}): "
                    "set MLFLOW_TRACKING_USERNAME/PASSWORD or MLFLOW_TRACKING_TOKEN"
                ) from None
            if err.code != 404:  # a proxy without /health still answers: the API is checked by MLflow
                raise TrackingError(
                    f"tracking server {uri} answered HTTP {err.code} {err.reason} on /health; {fix}"
                ) from None
        except (urllib.error.URLError, TimeoutError, ConnectionError, OSError) as err:
            raise TrackingError(
                f"tracking server {uri} is not reachable within {timeout_s:.0f} s ({getattr(err, 'reason', err)}); "
                f"start it (`mlflow server --host 0.0.0.0 --port 5000 ...`) or {fix}"
            ) from None
        _check_tracking_api(uri, timeout_s, fix)


MLFLOW_TABLES = {"alembic_version", "experiments", "runs"}  # in every MLflow sqlite store, whatever its version


def _check_sqlite_store(uri: str, path: Path, fix: str) -> None:
    """An existing sqlite file must be an MLflow store (or empty: MLflow creates its tables), and readable: a file
    of another program would silently get MLflow's tables, a damaged one a raw traceback mid-sweep. Read only."""
    try:
        with contextlib.closing(sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, timeout=30)) as db:
            tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            verdict = db.execute("PRAGMA quick_check(1)").fetchone()
    except sqlite3.Error as err:
        raise TrackingError(
            f"tracking.uri={uri!r}: {path} is not a readable sqlite database ({err}); restore it from a backup, "
            f"move it aside, or {fix}"
        ) from None
    if verdict is None or verdict[0] != "ok":
        raise TrackingError(
            f"tracking.uri={uri!r}: {path} is damaged (sqlite's quick_check: {verdict[0] if verdict else '?'}); "
            f"restore it from a backup, move it aside, or {fix}"
        )
    if tables and not MLFLOW_TABLES <= tables:
        shown = ", ".join(sorted(tables)[:5]) + (", ..." if len(tables) > 5 else "")
        raise TrackingError(
            f"tracking.uri={uri!r}: {path} is a sqlite database of another program (tables: {shown}), not an MLflow "
            f"store: MLflow would add its tables to it; point tracking.uri at a new file, or {fix}"
        )


def _check_tracking_api(uri: str, timeout_s: float, fix: str) -> None:
    """One call of the tracking API itself (a server whose /health answers may still fail every call, and
    MLflow's client would retry it for minutes): an experiment search, with the client's credentials."""
    url = uri.rstrip("/") + "/api/2.0/mlflow/experiments/search?max_results=1"
    request = urllib.request.Request(url)
    token = os.environ.get("MLFLOW_TRACKING_TOKEN")
    user, password = os.environ.get("MLFLOW_TRACKING_USERNAME"), os.environ.get("MLFLOW_TRACKING_PASSWORD")
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    elif user and password:
        request.add_header("Authorization", "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode())
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            body = response.read(1 << 20)
        json.loads(body or b"{}")
    except urllib.error.HTTPError as err:
        if err.code in (401, 403):
            raise TrackingError(
                f"tracking server {uri} refused the API call (HTTP {err.code}): "
                "set MLFLOW_TRACKING_USERNAME/PASSWORD or MLFLOW_TRACKING_TOKEN"
            ) from None
        raise TrackingError(
            f"tracking server {uri} answers /health but its API fails (HTTP {err.code} {err.reason} on "
            f"/api/2.0/mlflow/experiments/search): check the server's log and its backend store; {fix}"
        ) from None
    except ValueError:
        raise TrackingError(
            f"tracking server {uri} answers /health but its API does not answer JSON (is it an MLflow server?); {fix}"
        ) from None
    except (urllib.error.URLError, TimeoutError, ConnectionError, OSError) as err:
        raise TrackingError(
            f"tracking server {uri} answers /health but its API does not answer within {timeout_s:.0f} s "
            f"({getattr(err, 'reason', err)}); {fix}"
        ) from None
