"""Spider execution accuracy: run gold and predicted SQL on the database and compare the results.

- Databases are opened read-only (``file:...?mode=ro`` URI), with ``PRAGMA query_only`` and an
  authorizer that allows reading only: a ``DROP TABLE``, ``UPDATE``, ``ATTACH`` or ``PRAGMA`` prediction
  is refused by SQLite before it touches anything.
- Each query has a wall-clock budget enforced inside SQLite by a progress handler (it interrupts
  the virtual machine, including while rows are fetched), a cap on the number of rows and one on
  the size of the whole result (``max_bytes``): the rows are measured one by one as they are
  fetched (UTF-8 length of text, length of blobs, 8 bytes per number or NULL) against that budget,
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
import re
import sqlite3
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence
from urllib.parse import quote

import sqlparse

from pipeline.data import load_dataset
from pipeline.scoring import fenced_blocks, prediction_text, print_json, read_predictions, run_cli

DEFAULT_TIMEOUT_S = 10.0
DEFAULT_MAX_ROWS = 100_000
DEFAULT_MAX_BYTES = 64 * 2**20

# sqlite3 authorizer action codes that a read-only query needs.
_ALLOWED_ACTIONS = {
    sqlite3.SQLITE_SELECT,
    sqlite3.SQLITE_READ,
    sqlite3.SQLITE_FUNCTION,
    getattr(sqlite3, "SQLITE_RECURSIVE", 33),
}


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
        text = text[match.start(1):]
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


@dataclass
class QueryResult:
    rows: list[tuple] | None
    error: str | None = None
    timed_out: bool = False
    duration_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.rows is not None


def _authorizer(action: int, *_: Any) -> int:
    return sqlite3.SQLITE_OK if action in _ALLOWED_ACTIONS else sqlite3.SQLITE_DENY


def connect_read_only(db_path: str | Path) -> sqlite3.Connection:
    """A connection that can only read ``db_path`` (fails if the file does not exist)."""
    path = Path(db_path).resolve()
    if not path.is_file():
        raise FileNotFoundError(f"database not found: {path}")
    conn = sqlite3.connect(f"file:{quote(str(path))}?mode=ro", uri=True, check_same_thread=False)
    conn.text_factory = lambda b: b.decode(errors="ignore")  # some Spider databases hold non-UTF-8 bytes
    conn.execute("PRAGMA query_only = ON")
    conn.set_authorizer(_authorizer)
    return conn


def remove_distinct(sql: str) -> str:
    """``sql`` without its ``DISTINCT`` keywords (the official evaluation's ``remove_distinct``)."""
    statements = sqlparse.parse(sql)
    if not statements:
        return sql
    return "".join(t.value for t in statements[0].flatten() if t.value.lower() != "distinct")


def _row_bytes(row: tuple) -> int:
    size = 0
    for value in row:
        if isinstance(value, str):
            size += len(value.encode("utf-8", "surrogatepass"))
        elif isinstance(value, (bytes, bytearray, memoryview)):
            size += len(value)
        else:
            size += 8
    return size


def _value_limit(budget: int, ncols: int) -> int:
    """SQLite's length limit (the largest string or blob it builds) for ``budget`` bytes over ``ncols`` columns."""
    return max(1, min(int(budget) // max(1, ncols), 2**31 - 1))


def _result_columns(conn: sqlite3.Connection, sql: str) -> int:
    """The number of columns of the statement's result, from its compiled program (``EXPLAIN``: compiled,
    not run); SQLite's column limit when it cannot be told (the most a result can have)."""
    try:
        program = conn.execute("EXPLAIN " + sql).fetchall()
    except (sqlite3.Error, sqlite3.Warning, ValueError, OverflowError):
        return conn.getlimit(sqlite3.SQLITE_LIMIT_COLUMN)
    counts = [int(op[3]) for op in program if op[1] == "ResultRow"]
    return max(counts, default=1) or 1


def execute(
    db_path: str | Path,
    sql: str,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    max_rows: int = DEFAULT_MAX_ROWS,
    max_bytes: int = DEFAULT_MAX_BYTES,
) -> QueryResult:
    """Run one statement read-only with a wall-clock budget that really interrupts SQLite, and
    caps on the rows and bytes of its result."""
    start = time.perf_counter()
    deadline = time.monotonic() + timeout_s
    expired = [False]

    def progress() -> int:
        if time.monotonic() > deadline:
            expired[0] = True
            return 1  # non-zero: SQLite aborts the statement with SQLITE_INTERRUPT
        return 0

    try:
        conn = connect_read_only(db_path)
    except (sqlite3.Error, OSError) as err:
        return QueryResult(None, f"cannot open database: {err}")
    conn.set_progress_handler(progress, 1000)
    if "\x00" in sql:  # SQLite would read the statement only up to it: refused rather than guessed at
        conn.close()
        return QueryResult(None, "the SQL contains a NUL character", duration_s=time.perf_counter() - start)
    too_big = f"result larger than {max_bytes} bytes"
    try:
        # The whole result is capped, not only each value: no string or blob may exceed the part of the
        # byte budget left divided by the number of columns (SQLite refuses to build one, so a row can
        # never be larger than what is left), and the budget shrinks as rows are fetched.
        conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, _value_limit(max_bytes, 1))
        ncols = _result_columns(conn, sql)
        conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, _value_limit(max_bytes, ncols))
        cursor = conn.execute(sql)
        rows: list[tuple] = []
        size = 0
        for row in cursor:  # one row at a time: measured, and the budget lowered, before the next
            if len(rows) >= max_rows:
                return QueryResult(None, f"more than {max_rows} rows", duration_s=time.perf_counter() - start)
            rows.append(row)
            size += _row_bytes(row)
            if size > max_bytes:
                return QueryResult(None, too_big, duration_s=time.perf_counter() - start)
            conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, _value_limit(max_bytes - size, ncols))
        return QueryResult(rows, duration_s=time.perf_counter() - start)
    except (sqlite3.Error, sqlite3.Warning, ValueError, OverflowError, MemoryError) as err:
        if expired[0]:
            return QueryResult(None, f"timed out after {timeout_s} s", True, time.perf_counter() - start)
        if "too big" in str(err):
            return QueryResult(None, f"{too_big} ({err})", duration_s=time.perf_counter() - start)
        return QueryResult(None, f"{type(err).__name__}: {err}", duration_s=time.perf_counter() - start)
    finally:
        conn.close()


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
    keep_distinct: bool = True,
) -> dict[str, Any]:
    """Execution accuracy of predictions (``id``: position in dev.json, ``prediction``: SQL or answer).

    ``samples`` maps ids to Spider samples (``pipeline.data.spider``) or to mappings with ``query``
    and ``db_path``. A gold query that fails is reported (``gold_error``) and counts as wrong.
    ``keep_distinct=False`` removes ``DISTINCT`` from gold and prediction, as the official
    evaluation does by default.
    """
    if max_rows < 1 or max_bytes < 1 or not timeout_s > 0:
        raise ValueError(f"max_rows and max_bytes must be >= 1 and timeout_s > 0 (got {max_rows}, {max_bytes}, {timeout_s})")
    predictions = list(predictions)
    for pred in predictions:
        prediction_text(pred, f"for {pred.get('id')!r}")
    prepare = (lambda q: q) if keep_distinct else _strip_distinct
    details = []
    gold_cache: dict[tuple[str, str], QueryResult] = {}
    for pred in predictions:
        sid = str(pred["id"])
        if sid not in samples:
            raise KeyError(f"unknown Spider sample id {sid!r}")
        ref = samples[sid].reference if hasattr(samples[sid], "reference") else samples[sid]
        key = (ref["db_path"], ref["query"])
        if key not in gold_cache:
            gold_cache[key] = execute(ref["db_path"], prepare(ref["query"]), timeout_s, max_rows, max_bytes)
        gold = gold_cache[key]
        sql = extract_sql(prediction_text(pred))
        result = (execute(ref["db_path"], prepare(sql), timeout_s, max_rows, max_bytes) if sql
                  else QueryResult(None, "empty SQL"))
        ordered = order_matters(ref["query"])
        correct = gold.ok and result.ok and results_match(gold.rows, result.rows, ordered)
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
    parser.add_argument("--strip-distinct", action="store_true",
                        help="remove DISTINCT from gold and prediction (the official evaluation's default)")
    args = parser.parse_args(argv)
    for flag, value in (("--max-rows", args.max_rows), ("--max-bytes", args.max_bytes)):
        if value < 1:
            parser.error(f"{flag} must be >= 1, got {value}")
    if not args.timeout > 0:
        parser.error(f"--timeout must be > 0, got {args.timeout}")
    samples = load_dataset("spider", args.data, args.split, database_dir=args.database_dir)
    result = score_predictions(
        read_predictions(args.predictions, text=True), {s.id: s for s in samples}, timeout_s=args.timeout,
        max_rows=args.max_rows, max_bytes=args.max_bytes, keep_distinct=not args.strip_distinct,
    )
    print_json(result)
    return 0


if __name__ == "__main__":
    raise SystemExit(run_cli(main))
