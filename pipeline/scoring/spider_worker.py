"""Spider's query process: runs one SQL query at a time for ``pipeline.scoring.spider`` and answers with its rows.

Run as ``python -I -S -B spider_worker.py HEAP_BYTES EXTRA_ADDRESS_SPACE_BYTES`` (standard library only, so
it needs neither the project nor site-packages). Why a process of its own: SQLite checks for interrupts
(``sqlite3_interrupt``, the progress handler) only between the instructions of its virtual machine, and
one instruction can run for hours (``instr`` over two multi-megabyte strings is quadratic: 82 s for
4M/2M characters); only killing the process stops it, and the scorer does so at the query's deadline.
The memory limits below then bound whatever the query builds, and they are this process's, not the
scorer's (which may hold models).

At start it sets its own limits and says it is ready (one byte ``R`` on stdout):

- address space: what the interpreter had at start plus ``EXTRA_ADDRESS_SPACE_BYTES`` (``RLIMIT_AS``);
- SQLite's heap (``PRAGMA hard_heap_limit``, process-wide: page cache, sorter, compiled statements and
  every string built): ``HEAP_BYTES``; past it SQLite fails the query with "out of memory";
- no file may be written (``RLIMIT_FSIZE`` 0, ``SIGXFSZ`` ignored: a write fails instead of killing), and
  temporary tables, indices and sorts are kept in memory (``PRAGMA temp_store = MEMORY``): SQLite's temp
  files, which once spilled 5.2 GB in 10 s, cannot exist, and their content counts against the heap;
- CPU time: before each query the soft ``RLIMIT_CPU`` is set to what was used plus the timeout plus
  1-2 s, and the process dies with its parent (``PR_SET_PDEATHSIG``): a scorer killed mid-query leaves
  nothing running.

Then, per request (4-byte big-endian length + JSON: ``db``, ``sql``, ``timeout_s``, ``max_rows``,
``max_bytes``, ``max_sql_bytes``), it answers with an 8-byte big-endian length and a pickle of
``{rows, error, timed_out, nbytes, exit}`` (plain tuples of None, int, float, str and bytes; the scorer
unpickles without any class lookup). ``exit`` says it ends after this answer (after "out of memory":
a fresh process is cheaper than trusting the heap). End of input ends it.

The query runs read-only (``mode=ro`` URI, ``PRAGMA query_only``, an authorizer that allows reading
only), with SQLite's limits lowered: the statement's length (``SQLITE_LIMIT_SQL_LENGTH``), no attached
databases, few bound variables, bounded expression depth and compound SELECTs; the length limit of any
string or blob it builds is what is left of the byte budget (``max_bytes``) divided by the number of
result columns (never less than the statement's own length: the column names are built under it too),
re-set before each row. Each row is charged its values' sizes (UTF-8 length of text,
length of blobs, 8 bytes per number) plus ``CELL_BYTES`` per value (NULLs and empty blobs included)
and ``ROW_BYTES`` per row: roughly what Python holds for them, so a result of ``max_bytes`` charged
bytes takes at most about twice that in memory.
"""

from __future__ import annotations

import json
import pickle
import resource
import signal
import sqlite3
import struct
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote

CELL_BYTES = 32  # per value: its pointer in the row plus the object (int 28, float 24, str 49 + length)
ROW_BYTES = 56  # per row: the tuple's header and its slot in the list of rows
MAX_VARIABLES = 100
MAX_EXPR_DEPTH = 1000  # SQLite's default, stated so that a build with a larger one does not widen it
MAX_COMPOUND_SELECT = 500  # likewise

# sqlite3 authorizer action codes that a read-only query needs.
_ALLOWED_ACTIONS = {
    sqlite3.SQLITE_SELECT,
    sqlite3.SQLITE_READ,
    sqlite3.SQLITE_FUNCTION,
    getattr(sqlite3, "SQLITE_RECURSIVE", 33),
}


def _authorizer(action: int, *_: Any) -> int:
    return sqlite3.SQLITE_OK if action in _ALLOWED_ACTIONS else sqlite3.SQLITE_DENY


def row_bytes(row: tuple) -> int:
    """What a fetched row is charged against the byte budget (every value, NULLs and empty blobs included)."""
    size = ROW_BYTES + CELL_BYTES * len(row)
    for value in row:
        if isinstance(value, str):
            size += len(value.encode("utf-8", "surrogatepass"))
        elif isinstance(value, (bytes, bytearray, memoryview)):
            size += len(value)
        elif value is not None:
            size += 8
    return size


def value_limit(budget: int, ncols: int, floor: int = 1) -> int:
    """SQLite's length limit (the largest string or blob it builds) for a row of ``ncols`` values within ``budget``
    bytes.

    Never below ``floor``: the statement's own length, because SQLite builds the result's column names
    (spans of the statement's text) under the same limit; a value longer than the row's share of the
    budget then still fails the query when its row is charged.
    """
    left = int(budget) - ROW_BYTES - CELL_BYTES * max(1, ncols)
    return max(1, int(floor), min(left // max(1, ncols), 2**31 - 1))


def result_columns(conn: sqlite3.Connection, sql: str) -> int:
    """The number of columns of the statement's result, from its compiled program (``EXPLAIN``: compiled,
    not run); SQLite's column limit when it cannot be told (the most a result can have)."""
    try:
        program = conn.execute("EXPLAIN " + sql).fetchall()
    except (sqlite3.Error, sqlite3.Warning, ValueError, OverflowError):
        return conn.getlimit(sqlite3.SQLITE_LIMIT_COLUMN)
    counts = [int(op[3]) for op in program if op[1] == "ResultRow"]
    return max(counts, default=1) or 1


def connect_read_only(db_path: str, max_sql_bytes: int) -> sqlite3.Connection:
    """A connection that can only read ``db_path``, with temp storage in memory and SQLite's limits lowered."""
    path = Path(db_path)
    if not path.is_file():
        raise FileNotFoundError(f"database not found: {path}")
    conn = sqlite3.connect(f"file:{quote(str(path))}?mode=ro", uri=True)
    conn.text_factory = lambda b: b.decode(errors="ignore")  # some Spider databases hold non-UTF-8 bytes
    for pragma in ("query_only = ON", "temp_store = MEMORY", "mmap_size = 0"):
        conn.execute(f"PRAGMA {pragma}")
    # The schema is read now, before the length limit is lowered to the result's budget: its CREATE
    # statements are strings SQLite builds too, and a small budget would otherwise fail every query.
    conn.execute("SELECT count(*) FROM sqlite_master").fetchall()
    conn.setlimit(sqlite3.SQLITE_LIMIT_SQL_LENGTH, max(1, int(max_sql_bytes)))
    conn.setlimit(sqlite3.SQLITE_LIMIT_ATTACHED, 0)
    conn.setlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER, MAX_VARIABLES)
    conn.setlimit(sqlite3.SQLITE_LIMIT_EXPR_DEPTH, MAX_EXPR_DEPTH)
    conn.setlimit(sqlite3.SQLITE_LIMIT_COMPOUND_SELECT, MAX_COMPOUND_SELECT)
    conn.set_authorizer(_authorizer)
    return conn


def run_query(req: dict[str, Any], heap_bytes: int) -> dict[str, Any]:
    """One request's answer: ``rows`` or ``error`` (``timed_out``: the progress handler stopped it)."""
    timeout_s, max_rows, max_bytes = float(req["timeout_s"]), int(req["max_rows"]), int(req["max_bytes"])
    sql = req["sql"]
    deadline = time.monotonic() + timeout_s
    used = resource.getrusage(resource.RUSAGE_SELF)
    cpu = int(used.ru_utime + used.ru_stime + timeout_s) + 2
    hard = resource.getrlimit(resource.RLIMIT_CPU)[1]
    resource.setrlimit(resource.RLIMIT_CPU, (cpu if hard == resource.RLIM_INFINITY else min(cpu, hard), hard))
    expired = [False]

    def progress() -> int:
        if time.monotonic() > deadline:
            expired[0] = True
            return 1  # non-zero: SQLite aborts the statement with SQLITE_INTERRUPT
        return 0

    def failed(error: str, *, timed_out: bool = False, exit: bool = False) -> dict[str, Any]:
        return {"rows": None, "error": error, "timed_out": timed_out, "nbytes": 0, "exit": exit}

    try:
        conn = connect_read_only(req["db"], req["max_sql_bytes"])
    except (sqlite3.Error, OSError) as err:
        return failed(f"cannot open database: {err}")
    too_big = f"result larger than {max_bytes} bytes"
    rows: list[tuple] = []
    try:
        conn.set_progress_handler(progress, 1000)
        # The whole result is capped, not only each value: no string or blob may exceed the part of the
        # byte budget left divided by the number of columns (SQLite refuses to build one, so a row can
        # never be larger than what is left), and the budget shrinks as rows are fetched.
        floor = len(sql.encode("utf-8", "surrogatepass"))
        conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, value_limit(max_bytes, 1, floor))
        ncols = result_columns(conn, sql)
        conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, value_limit(max_bytes, ncols, floor))
        cursor = conn.execute(sql)
        size = 0
        for row in cursor:  # one row at a time: measured, and the budget lowered, before the next
            if len(rows) >= max_rows:
                return failed(f"more than {max_rows} rows")
            rows.append(row)
            size += row_bytes(row)
            if size > max_bytes:
                return failed(too_big)
            conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, value_limit(max_bytes - size, ncols, floor))
        return {"rows": rows, "error": None, "timed_out": False, "nbytes": size, "exit": False}
    except MemoryError:
        rows.clear()
        return failed(
            f"out of memory (more than SQLite's {heap_bytes >> 20} MiB or this process's address space)", exit=True
        )
    except (sqlite3.Error, sqlite3.Warning, ValueError, OverflowError) as err:
        if expired[0]:
            return failed(f"timed out after {timeout_s} s", timed_out=True)
        if "too big" in str(err):
            return failed(f"{too_big} ({err})")
        return failed(f"{type(err).__name__}: {err}")
    finally:
        conn.close()


def _set_limits(heap_bytes: int, extra_address_space: int) -> None:
    """This process's own limits (module docstring); the heap limit is SQLite's, for every connection."""
    try:  # die with the scorer (Linux); elsewhere the CPU limit and end of input still end it
        import ctypes  # noqa: PLC0415 - only here, at start

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    try:
        with open("/proc/self/status") as status:
            size_kb = next((int(line.split()[1]) for line in status if line.startswith("VmSize:")), 0)
    except OSError:  # no /proc: the limit is the extra alone, which an interpreter's start fits in many times
        size_kb = 0
    limit = size_kb * 1024 + int(extra_address_space)
    hard = resource.getrlimit(resource.RLIMIT_AS)[1]
    resource.setrlimit(resource.RLIMIT_AS, (limit if hard == resource.RLIM_INFINITY else min(limit, hard), hard))
    conn = sqlite3.connect(":memory:")
    conn.execute(f"PRAGMA hard_heap_limit = {int(heap_bytes)}")
    conn.close()


def _read_exactly(stream: Any, n: int) -> bytes | None:
    data = stream.read(n)
    return data if data is not None and len(data) == n else None


def main(argv: list[str]) -> int:
    heap_bytes, extra_address_space = int(argv[0]), int(argv[1])
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    _set_limits(heap_bytes, extra_address_space)
    stdout.write(b"R")
    stdout.flush()
    while True:
        header = _read_exactly(stdin, 4)
        if header is None:
            return 0
        body = _read_exactly(stdin, struct.unpack(">I", header)[0])
        if body is None:
            return 0
        try:
            answer = run_query(json.loads(body), heap_bytes)
            data = pickle.dumps(answer, protocol=pickle.HIGHEST_PROTOCOL)
        except MemoryError:
            answer = {
                "rows": None,
                "error": "out of memory (the query process's address space)",
                "timed_out": False,
                "nbytes": 0,
                "exit": True,
            }
            data = pickle.dumps(answer)
        done = answer["exit"]
        del answer  # the rows: not held twice while the next query runs
        stdout.write(struct.pack(">Q", len(data)))
        stdout.write(data)
        stdout.flush()
        del data
        if done:
            return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
