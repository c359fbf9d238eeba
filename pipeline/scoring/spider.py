"""Spider execution accuracy: run gold and predicted SQL on the database and compare the results.

- Databases are opened read-only (``file:...?mode=ro`` URI), with ``PRAGMA query_only`` and an
  authorizer that allows reading only: a ``DROP TABLE``, ``UPDATE``, ``ATTACH`` or ``PRAGMA`` prediction
  is refused by SQLite before it touches anything.
- Each query runs in a query process of its own (``spider_worker.py``, kept for the next query),
  which the scorer kills at the query's deadline (``timeout_s``: compiling, running and returning the
  result): SQLite checks interrupts only between VM instructions, and one instruction (``instr`` over
  multi-megabyte strings) can run for hours. That process has its own memory limits (SQLite's
  ``hard_heap_limit`` and an address-space limit, both from ``max_bytes``), keeps temp storage in that
  memory and can write no file, and dies with the scorer.
- The statement is at most ``max_sql_bytes`` (100,000) UTF-8 bytes (checked before it is sent, and
  SQLite's ``SQLITE_LIMIT_SQL_LENGTH``); no attached databases, at most 100 bound variables, and
  SQLite's default expression depth and compound-SELECT limits, stated.
- Caps on the number of rows and on the size of the whole result (``max_bytes``): the rows are
  measured one by one as they are fetched (UTF-8 length of text, length of blobs, 8 bytes per number,
  plus 32 bytes per value, NULLs and empty blobs included, and 56 per row: about what Python holds),
  and before each row is built SQLite's own length limit is lowered to what is left of the budget
  divided by the number of columns (read from the compiled statement), so no row, however many
  columns it has, is ever built larger than the budget left (a ``zeroblob`` over 2,000 columns is
  refused before it exists); a query over either cap fails with an error saying which. Any text is
  accepted as a prediction: a NUL or a lone surrogate makes the query fail, not the scorer.
- ``DISTINCT``: by default kept, so ``SELECT DISTINCT x`` and ``SELECT x`` differ when ``x`` has
  duplicates. The official test-suite evaluation (``evaluation.py`` without ``--keep_distinct``)
  instead removes every ``DISTINCT`` token (sqlparse tokens) from both gold and prediction before
  executing them; ``keep_distinct=False`` (CLI ``--strip-distinct``) does the same.
- Results are compared as multisets of rows, allowing any column permutation; row order matters
  only when the gold query has ORDER BY (the rule of the official test-suite evaluation, Zhong et
  al. 2020).
- From a chat answer the SQL is taken from its first code block (else from the first SELECT/WITH),
  and cut after the first complete statement.
"""

from __future__ import annotations

import argparse
import io
import json
import math
import os
import pickle
import re
import select
import signal
import struct
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Iterable, Mapping, Sequence, cast

from pipeline.data import load_dataset
from pipeline.scoring import fenced_blocks, prediction_text, print_json, read_predictions, run_cli, scorer_package

DEFAULT_TIMEOUT_S = 10.0
DEFAULT_MAX_ROWS = 100_000
DEFAULT_MAX_BYTES = 64 * 2**20
DEFAULT_MAX_SQL_BYTES = 100_000  # a statement's UTF-8 length: compiling takes up to ~400 bytes per byte of SQL


# --------------------------------------------------------------------------- SQL extraction

_START_LINE = re.compile(r"(?im)^[ \t]*(SELECT|WITH)\b")
_START_ANY = re.compile(r"(?i)\b(SELECT|WITH)\b")


def extract_sql(text: str) -> str:
    """The first SQL statement of a prediction (a bare query, a continuation, or a chat answer)."""
    text = str(text)
    blocks = [(lang.lower(), content) for lang, content in fenced_blocks(text)]
    if blocks:
        sql_blocks = [b for lang, b in blocks if lang in ("sql", "sqlite")]
        text = (sql_blocks or [blocks[0][1]])[0]
    match = _START_LINE.search(text) or _START_ANY.search(text)
    if match:
        text = text[match.start(1) :]
    return _first_statement(text).strip().rstrip(";").strip()


_CLOSE = {"'": "'", '"': '"', "`": "`", "[": "]"}


def _first_statement(text: str) -> str:
    """Text up to the first complete statement (a ``;`` outside quotes, identifiers and comments, as
    ``sqlite3.complete_statement`` decides it), else up to a blank line. One pass over the text (any
    character, NUL included)."""
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c == ";":
            return text[: i + 1]
        if c in _CLOSE:  # a string or quoted identifier: to its closing character (doubled = escaped)
            end = text.find(_CLOSE[c], i + 1)
            while end >= 0 and c != "[" and text.startswith(_CLOSE[c], end + 1):
                end = text.find(_CLOSE[c], end + 2)
            if end < 0:
                break
            i = end + 1
        elif text.startswith("--", i):
            end = text.find("\n", i)
            if end < 0:
                break
            i = end + 1
        elif text.startswith("/*", i):
            end = text.find("*/", i + 2)
            if end < 0:
                break
            i = end + 2
        else:
            i += 1
    blank = re.search(r"\n[ \t]*\n", text)
    return text[: blank.start()] if blank else text


# --------------------------------------------------------------------------- execution

WORKER = Path(__file__).with_name("spider_worker.py")
WORKER_START_S = 60.0  # an interpreter's start on a loaded machine; not part of any query's time
_SLACK_BYTES = 64 * 2**20


@dataclass
class QueryResult:
    rows: list[tuple] | None
    error: str | None = None
    timed_out: bool = False
    duration_s: float = 0.0
    nbytes: int = 0  # what the rows were charged against the byte budget

    @property
    def ok(self) -> bool:
        return self.rows is not None


def heap_limit(max_bytes: int) -> int:
    """SQLite's heap in the query process: room to sort or group a result of ``max_bytes`` (twice it) and a margin."""
    return 2 * int(max_bytes) + _SLACK_BYTES


def address_space_limit(max_bytes: int) -> int:
    """The query process's address space beyond the interpreter's own at start: SQLite's heap, the rows
    (at most about twice their charged bytes), their pickle (about their bytes) and a margin."""
    return heap_limit(max_bytes) + 3 * int(max_bytes) + 2 * _SLACK_BYTES


class _NoClasses(pickle.Unpickler):
    """Unpickles plain data only: the answer holds tuples of None, int, float, str and bytes."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"the query process answered with an object of {module}.{name}")


class QueryRunner:
    """Runs queries one at a time in a child process (``spider_worker.py``) that is killed at each
    query's deadline: the only way to stop SQLite inside one long VM instruction (``sqlite3_interrupt``
    and the progress handler act between instructions; a timer thread calling ``interrupt`` was measured
    to stop an ``instr`` over 400k/200k characters only when it ended, 2.2 s against 0.5 s). The child
    holds SQLite's memory under its own limits (``heap_limit``, ``address_space_limit``), writes no file,
    and is started again after a kill, so a query never outlives its deadline and the scorer's memory
    holds at most the result it was given (within ``max_bytes``). Use it as a context manager."""

    def __init__(
        self,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        max_rows: int = DEFAULT_MAX_ROWS,
        max_bytes: int = DEFAULT_MAX_BYTES,
        max_sql_bytes: int = DEFAULT_MAX_SQL_BYTES,
    ):
        check_limits(timeout_s, max_rows, max_bytes, max_sql_bytes)
        self.timeout_s, self.max_rows, self.max_bytes, self.max_sql_bytes = (
            float(timeout_s),
            max_rows,
            max_bytes,
            max_sql_bytes,
        )
        self._proc: subprocess.Popen | None = None

    def __enter__(self) -> "QueryRunner":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        """End the query process (end of input; killed if it does not go within 2 s)."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        try:
            cast(IO[bytes], proc.stdin).close()  # both pipes (_start)
            proc.wait(timeout=2)
        except (OSError, subprocess.TimeoutExpired):
            proc.kill()
            proc.wait()
        finally:
            cast(IO[bytes], proc.stdout).close()

    def _kill(self) -> int:
        proc, self._proc = self._proc, None
        if proc is None:
            return 0
        proc.kill()
        returncode = proc.wait()
        for stream in cast("tuple[IO[bytes], IO[bytes]]", (proc.stdin, proc.stdout)):  # both pipes (_start)
            try:
                stream.close()
            except OSError:
                pass
        return returncode

    def _start(self) -> subprocess.Popen:
        """The query process, started if none is running, once it has said it is ready."""
        if self._proc is not None and self._proc.poll() is None:
            return self._proc
        self._kill()
        proc = subprocess.Popen(
            [
                sys.executable,
                "-I",
                "-S",
                "-B",
                str(WORKER),
                str(heap_limit(self.max_bytes)),
                str(address_space_limit(self.max_bytes)),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            close_fds=True,
        )
        self._proc = proc
        if _read_until(cast(IO[bytes], proc.stdout).fileno(), 1, time.monotonic() + WORKER_START_S) != b"R":
            code = self._kill()
            raise RuntimeError(f"Spider's query process ({sys.executable} {WORKER}) did not start (exit status {code})")
        return proc

    def run(self, db_path: str | Path, sql: str) -> QueryResult:
        """Run one statement read-only within the runner's deadline and caps (``QueryResult``)."""
        start = time.perf_counter()

        def failed(error: str, timed_out: bool = False) -> QueryResult:
            return QueryResult(None, error, timed_out, time.perf_counter() - start)

        if "\x00" in sql:  # SQLite would read the statement only up to it: refused rather than guessed at
            return failed("the SQL contains a NUL character")
        try:
            length = len(sql.encode("utf-8"))
        except UnicodeEncodeError as err:
            return failed(f"the SQL is not valid Unicode text ({err.reason} at character {err.start})")
        if length > self.max_sql_bytes:
            return failed(f"the SQL is longer than {self.max_sql_bytes} bytes ({length}; --max-sql-bytes)")
        path = Path(db_path).resolve()
        if not path.is_file():
            return failed(f"cannot open database: database not found: {path}")
        request = json.dumps(
            {
                "db": str(path),
                "sql": sql,
                "timeout_s": self.timeout_s,
                "max_rows": self.max_rows,
                "max_bytes": self.max_bytes,
                "max_sql_bytes": self.max_sql_bytes,
            }
        ).encode()
        proc = self._start()
        deadline = time.monotonic() + self.timeout_s
        assert proc.stdin is not None and proc.stdout is not None  # started with both as PIPE (_start)
        try:
            _write_all(proc.stdin.fileno(), struct.pack(">I", len(request)) + request)
            header = _read_until(proc.stdout.fileno(), 8, deadline)
            if len(header) == 8:
                size = struct.unpack(">Q", header)[0]
                if size > 2 * self.max_bytes + _SLACK_BYTES:
                    code = self._kill()
                    return failed(
                        f"the query process answered with {size} bytes, more than its result may take (exit status "
                        f"{code})"
                    )
                body = _read_until(proc.stdout.fileno(), size, deadline)
                header = header if len(body) == size else b""
        except OSError:  # the process is gone (its pipe closed): reported below
            header = b""
        if len(header) != 8:
            if time.monotonic() >= deadline:
                self._kill()
                return failed(f"timed out after {self.timeout_s} s", True)
            code = self._kill()
            return failed(f"the query process ended without an answer ({_describe_exit(code)})")
        answer = _NoClasses(io.BytesIO(body)).load()
        del body
        if answer.get("exit"):
            self._kill()
        rows = answer["rows"]
        return QueryResult(
            None if rows is None else list(rows),
            answer["error"],
            bool(answer["timed_out"]),
            time.perf_counter() - start,
            int(answer.get("nbytes") or 0),
        )


def _describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit status {code}"


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _read_until(fd: int, n: int, deadline: float) -> bytes | bytearray:
    """Up to ``n`` bytes from ``fd``, fewer when it closes or ``deadline`` (``time.monotonic``) passes."""
    buf = bytearray(n)
    view, got = memoryview(buf), 0
    poller = select.poll()  # not select.select: a process with many descriptors (a Ray worker) may pass 1024
    poller.register(fd, select.POLLIN)
    while got < n:
        left = deadline - time.monotonic()
        if left <= 0 or not poller.poll(max(1, math.ceil(left * 1000))):
            break
        count = os.readv(fd, [view[got:]])
        if count == 0:
            break
        got += count
    view.release()
    if got < n:
        del buf[got:]
    return buf


def check_limits(timeout_s: float, max_rows: int, max_bytes: int, max_sql_bytes: int) -> None:
    """ValueError naming the setting when a limit is not a positive, finite number."""
    if not (isinstance(timeout_s, (int, float)) and math.isfinite(timeout_s) and timeout_s > 0):
        raise ValueError(f"timeout_s must be a finite number of seconds > 0 (got {timeout_s!r})")
    for name, value in (("max_rows", max_rows), ("max_bytes", max_bytes), ("max_sql_bytes", max_sql_bytes)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an integer >= 1 (got {value!r})")


def execute(
    db_path: str | Path,
    sql: str,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    max_rows: int = DEFAULT_MAX_ROWS,
    max_bytes: int = DEFAULT_MAX_BYTES,
    max_sql_bytes: int = DEFAULT_MAX_SQL_BYTES,
) -> QueryResult:
    """Run one statement read-only in a query process of its own (``QueryRunner``): a wall-clock budget
    that really stops SQLite, and caps on the rows and bytes of its result."""
    with QueryRunner(timeout_s, max_rows, max_bytes, max_sql_bytes) as runner:
        return runner.run(db_path, sql)


def remove_distinct(sql: str) -> str:
    """``sql`` without its ``DISTINCT`` keywords (the official evaluation's ``remove_distinct``)."""
    statements = scorer_package("sqlparse", "sqlparse", "spider").parse(sql)
    if not statements:
        return sql
    return "".join(t.value for t in statements[0].flatten() if t.value.lower() != "distinct")


# --------------------------------------------------------------------------- comparison


def order_matters(gold_sql: str) -> bool:
    return re.search(r"\border\s+by\b", gold_sql, re.I) is not None


def _column_permutations(gold: list[tuple], pred: list[tuple], ncols: int, ordered: bool) -> Iterable[list[int]]:
    """Injective maps gold column -> predicted column whose columns agree (as sequences or multisets)."""

    def column(rows: list[tuple], j: int):
        values = [r[j] for r in rows]
        return tuple(values) if ordered else Counter(values)

    gold_cols = [column(gold, i) for i in range(ncols)]
    pred_cols = [column(pred, j) for j in range(ncols)]
    candidates = [[j for j in range(ncols) if pred_cols[j] == gold_cols[i]] for i in range(ncols)]
    perm: list[int] = []
    used: set[int] = set()

    def search(i: int):
        if i == ncols:
            yield list(perm)
            return
        for j in candidates[i]:
            if j not in used:
                used.add(j)
                perm.append(j)
                yield from search(i + 1)
                perm.pop()
                used.discard(j)

    return search(0)


def results_match(gold: Sequence[tuple], pred: Sequence[tuple], ordered: bool) -> bool:
    """Same rows (as a multiset, or in order when ``ordered``) under some permutation of the columns."""
    gold, pred = [tuple(r) for r in gold], [tuple(r) for r in pred]
    if not gold and not pred:
        return True
    if len(gold) != len(pred) or len(gold[0]) != len(pred[0]):
        return False
    ncols = len(gold[0])
    gold_rows = gold if ordered else Counter(gold)
    for perm in _column_permutations(gold, pred, ncols, ordered):
        permuted = [tuple(row[j] for j in perm) for row in pred]
        if (permuted if ordered else Counter(permuted)) == gold_rows:
            return True
    return False


# --------------------------------------------------------------------------- scoring


def _strip_distinct(sql: str) -> str:
    try:
        return remove_distinct(sql)
    except Exception:  # noqa: BLE001  sqlparse cannot parse it: executed as is (and fails there)
        return sql


def score_predictions(
    predictions: Iterable[Mapping[str, Any]],
    samples: Mapping[str, Any],
    *,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    max_rows: int = DEFAULT_MAX_ROWS,
    max_bytes: int = DEFAULT_MAX_BYTES,
    max_sql_bytes: int = DEFAULT_MAX_SQL_BYTES,
    keep_distinct: bool = True,
) -> dict[str, Any]:
    """Execution accuracy of predictions (``id``: position in dev.json, ``prediction``: SQL or answer).

    ``samples`` maps ids to Spider samples (``pipeline.data.spider``) or to mappings with ``query``
    and ``db_path``. A gold query that fails is reported (``gold_error``) and counts as wrong.
    ``keep_distinct=False`` removes ``DISTINCT`` from gold and prediction, as the official
    evaluation does by default. Every query (gold and predicted) runs in one query process
    (``QueryRunner``), started again after a query it had to kill; gold results are kept for the
    predictions that share them while they hold ``max_bytes`` in all (the scorer's memory stays
    within a few times ``max_bytes``).
    """
    check_limits(timeout_s, max_rows, max_bytes, max_sql_bytes)
    predictions = list(predictions)
    for pred in predictions:
        prediction_text(pred, f"for {pred.get('id')!r}")
    if not keep_distinct:  # before any query: without sqlparse every DISTINCT would silently stay
        scorer_package("sqlparse", "sqlparse", "spider")
    prepare = (lambda q: q) if keep_distinct else _strip_distinct
    details = []
    gold_cache: dict[tuple[str, str], QueryResult] = {}
    cached_bytes = 0
    with QueryRunner(timeout_s, max_rows, max_bytes, max_sql_bytes) as runner:
        for pred in predictions:
            sid = str(pred["id"])
            if sid not in samples:
                raise KeyError(f"unknown Spider sample id {sid!r}")
            ref = samples[sid].reference if hasattr(samples[sid], "reference") else samples[sid]
            key = (ref["db_path"], ref["query"])
            gold = gold_cache.get(key)
            if gold is None:
                gold = runner.run(ref["db_path"], prepare(ref["query"]))
                if cached_bytes + gold.nbytes <= max_bytes:
                    gold_cache[key] = gold
                    cached_bytes += gold.nbytes
            sql = extract_sql(prediction_text(pred))
            result = runner.run(ref["db_path"], prepare(sql)) if sql else QueryResult(None, "empty SQL")
            ordered = order_matters(ref["query"])
            correct = gold.ok and result.ok and results_match(cast(list, gold.rows), cast(list, result.rows), ordered)
            details.append(
                {
                    "id": sid,
                    "db_id": ref.get("db_id"),
                    "correct": bool(correct),
                    "sql": sql,
                    "error": result.error,
                    "timed_out": result.timed_out,
                    "gold_error": gold.error,
                    "order_matters": ordered,
                    "duration_s": round(result.duration_s, 4),
                }
            )
            del gold, result
    n = len(details)
    return {
        "metric": "execution_accuracy",
        "score": sum(d["correct"] for d in details) / n if n else float("nan"),
        "num_samples": n,
        "num_correct": sum(d["correct"] for d in details),
        "num_errors": sum(d["error"] is not None for d in details),
        "num_timeouts": sum(d["timed_out"] for d in details),
        "num_gold_errors": sum(d["gold_error"] is not None for d in details),
        "timeout_s": timeout_s,
        "keep_distinct": keep_distinct,
        "details": details,
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", required=True, help="Spider folder (dev.json + database/) or a dev.json")
    parser.add_argument("--database-dir", default=None, help="databases folder, if not <data>/database")
    parser.add_argument("--split", default="dev")
    parser.add_argument("--predictions", required=True, help="JSONL of {id, prediction}")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, help="seconds per query")
    parser.add_argument("--max-rows", type=int, default=DEFAULT_MAX_ROWS, help="rows per result")
    parser.add_argument("--max-bytes", type=int, default=DEFAULT_MAX_BYTES, help="bytes per result")
    parser.add_argument(
        "--max-sql-bytes", type=int, default=DEFAULT_MAX_SQL_BYTES, help="UTF-8 bytes per SQL statement"
    )
    parser.add_argument(
        "--strip-distinct",
        action="store_true",
        help="remove DISTINCT from gold and prediction (the official evaluation's default)",
    )
    args = parser.parse_args(argv)
    for flag, value in (
        ("--max-rows", args.max_rows),
        ("--max-bytes", args.max_bytes),
        ("--max-sql-bytes", args.max_sql_bytes),
    ):
        if value < 1:
            parser.error(f"{flag} must be >= 1, got {value}")
    if not (math.isfinite(args.timeout) and args.timeout > 0):
        parser.error(f"--timeout must be a finite number of seconds > 0, got {args.timeout}")
    samples = load_dataset("spider", args.data, args.split, database_dir=args.database_dir)
    result = score_predictions(
        read_predictions(args.predictions, text=True),
        {s.id: s for s in samples},
        timeout_s=args.timeout,
        max_rows=args.max_rows,
        max_bytes=args.max_bytes,
        max_sql_bytes=args.max_sql_bytes,
        keep_distinct=not args.strip_distinct,
    )
    print_json(result)
    return 0


if __name__ == "__main__":
    raise SystemExit(run_cli(main))
