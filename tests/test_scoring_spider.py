"""Spider scorer: gold against gold, result comparison, read-only execution, time-outs, extraction, CLI."""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import shutil
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers.paths import REPO
from pipeline.data import load_dataset
from pipeline.scoring import spider as sp

DATA = REPO / "data" / "spider"


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def spider_samples():
    return load_dataset("spider", DATA)


@pytest.fixture
def toy_db(tmp_path):
    path = tmp_path / "toy.sqlite"
    conn = sqlite3.connect(path)
    conn.executescript(
        """
        CREATE TABLE singer (id INTEGER PRIMARY KEY, name TEXT, age INTEGER, country TEXT);
        INSERT INTO singer VALUES (1, 'Ann', 30, 'FR'), (2, 'Bob', 25, 'US'), (3, 'Cid', 41, 'US'),
                                  (4, 'Dee', 25, 'FR');
        """
    )
    conn.commit()
    conn.close()
    return path


def _sample(db: Path, gold: str) -> dict:
    return {"0": {"query": gold, "db_path": str(db), "db_id": "toy"}}


def _correct(db: Path, gold: str, pred: str) -> bool:
    return sp.score_predictions([{"id": "0", "prediction": pred}], _sample(db, gold))["details"][0]["correct"]


# ----------------------------------------------------------------------------- acceptance figures


def test_gold_against_gold_is_100_percent_on_all_710(spider_samples):
    assert len(spider_samples) == 710
    preds = [{"id": s.id, "prediction": s.reference["query"]} for s in spider_samples]
    result = sp.score_predictions(preds, {s.id: s for s in spider_samples})
    assert result["num_gold_errors"] == 0
    assert result["num_correct"] == 710 and result["score"] == 1.0


def test_row_order_ignored_without_order_by(toy_db):
    assert _correct(
        toy_db, "SELECT name FROM singer WHERE age < 35", "SELECT name FROM singer WHERE age < 35 ORDER BY name DESC"
    )


def test_row_order_checked_with_order_by(toy_db):
    gold = "SELECT name FROM singer ORDER BY age, name"
    assert _correct(toy_db, gold, "SELECT name FROM singer ORDER BY age ASC, name ASC")
    assert not _correct(toy_db, gold, "SELECT name FROM singer ORDER BY age DESC")


def test_column_permutation_allowed(toy_db):
    assert _correct(toy_db, "SELECT name, age FROM singer", "SELECT age, name FROM singer")
    assert _correct(
        toy_db, "SELECT name, age, country FROM singer ORDER BY id", "SELECT country, name, age FROM singer ORDER BY id"
    )


def test_column_permutation_must_be_consistent_across_rows():
    gold = [(1, 2), (3, 4)]
    assert sp.results_match(gold, [(2, 1), (4, 3)], ordered=False)
    assert not sp.results_match(gold, [(2, 1), (3, 4)], ordered=False)  # each row swapped differently
    # columns with equal value multisets: the permutation search must try both
    assert sp.results_match([(1, 1), (2, 2), (1, 2)], [(1, 1), (2, 2), (2, 1)], ordered=False)


def test_duplicates_count(toy_db):
    gold = "SELECT country FROM singer"
    assert not _correct(toy_db, gold, "SELECT DISTINCT country FROM singer")
    assert sp.results_match([("a",), ("a",), ("b",)], [("b",), ("a",), ("a",)], ordered=False)
    assert not sp.results_match([("a",), ("a",), ("b",)], [("a",), ("b",), ("b",)], ordered=False)


def test_wrong_values_and_shapes(toy_db):
    assert not _correct(toy_db, "SELECT count(*) FROM singer", "SELECT count(*) FROM singer WHERE age > 26")
    assert not _correct(toy_db, "SELECT name FROM singer", "SELECT name, age FROM singer")
    assert _correct(toy_db, "SELECT name FROM singer WHERE age > 100", "SELECT name FROM singer WHERE age > 200")
    assert not _correct(toy_db, "SELECT name FROM singer", "SELECT nme FROM singer")  # error


@pytest.mark.parametrize(
    "attack",
    [
        "DROP TABLE singer",
        "UPDATE singer SET age = 0",
        "DELETE FROM singer",
        "INSERT INTO singer VALUES (9, 'Eve', 1, 'XX')",
        "CREATE TABLE t (x)",
        "PRAGMA journal_mode = WAL",
        "VACUUM",
    ],
)
def test_writing_predictions_change_no_database_file(tmp_path, attack):
    src = DATA / "database" / "concert_singer" / "concert_singer.sqlite"
    db = tmp_path / "concert_singer.sqlite"
    shutil.copy(src, db)
    db.chmod(0o644)  # writable copy: only the scorer's read-only opening may protect it
    before = {p.name: _sha(p) for p in tmp_path.iterdir()}
    result = sp.score_predictions([{"id": "0", "prediction": attack}], _sample(db, "SELECT count(*) FROM singer"))
    detail = result["details"][0]
    assert not detail["correct"] and detail["error"]
    assert {p.name: _sha(p) for p in tmp_path.iterdir()} == before
    assert _sha(db) == _sha(src)


def test_attach_cannot_create_a_file(tmp_path, toy_db):
    target = tmp_path / "new.sqlite"
    result = sp.execute(toy_db, f"ATTACH DATABASE '{target}' AS x")
    assert not result.ok
    assert not target.exists()


def test_query_that_runs_forever_is_interrupted(toy_db):
    forever = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c"
    start = time.perf_counter()
    result = sp.execute(toy_db, forever, timeout_s=0.5)
    assert result.timed_out and not result.ok
    assert time.perf_counter() - start < 3
    scored = sp.score_predictions([{"id": "0", "prediction": forever}], _sample(toy_db, "SELECT 1"), timeout_s=0.5)
    assert scored["num_timeouts"] == 1 and scored["score"] == 0.0


def test_huge_result_is_capped(toy_db):
    cross = "SELECT * FROM singer a, singer b, singer c, singer d, singer e, singer f, singer g, singer h"
    result = sp.execute(toy_db, cross, max_rows=1000)
    assert not result.ok and "rows" in result.error


@pytest.mark.parametrize(
    "text, sql",
    [
        ("SELECT name FROM singer;", "SELECT name FROM singer"),
        ("SELECT name FROM singer;\n\n-- Question: how many?\nSELECT", "SELECT name FROM singer"),
        ("SELECT name FROM singer WHERE name = 'a;b'; DROP TABLE x;", "SELECT name FROM singer WHERE name = 'a;b'"),
        ("Here you go:\n```sql\nSELECT count(*)\nFROM singer\n```\nThis counts rows.", "SELECT count(*)\nFROM singer"),
        ("```\nselect 1\n```", "select 1"),
        ("The query is: SELECT max(age) FROM singer", "SELECT max(age) FROM singer"),
        ("SELECT a FROM t\n\nExplanation: ...", "SELECT a FROM t"),
        ("WITH x AS (SELECT 1) SELECT * FROM x", "WITH x AS (SELECT 1) SELECT * FROM x"),
    ],
)
def test_extract_sql(text, sql):
    assert sp.extract_sql(text) == sql


def test_cli_rescoring_saved_predictions(tmp_path, spider_samples):
    preds = tmp_path / "preds.jsonl"
    rows = [
        {"id": "0", "prediction": "```sql\n" + spider_samples[0].reference["query"] + "\n```"},
        {"id": "1", "prediction": "SELECT 42"},
    ]
    preds.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = subprocess.run(
        [sys.executable, "-m", "pipeline.scoring.spider", "--data", str(DATA), "--predictions", str(preds)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    result = json.loads(out.stdout)
    assert result["num_samples"] == 2 and result["num_correct"] == 1
    assert [d["correct"] for d in result["details"]] == [True, False]


# ----------------------------------------------------------------------------- result size and DISTINCT


@pytest.fixture
def blob_db(tmp_path):
    path = tmp_path / "blobs.sqlite"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE t (id INTEGER, b BLOB)")
    conn.executemany("INSERT INTO t VALUES (?, ?)", [(i, b"x" * (4 * 2**20)) for i in range(5)])
    conn.execute("CREATE TABLE big (b BLOB)")
    conn.execute("INSERT INTO big VALUES (?)", (b"y" * (12 * 2**20),))
    conn.commit()
    conn.close()
    return path


def test_result_bytes_are_capped_as_rows_are_fetched(blob_db):
    # five 4 MiB rows: each below the cap, together above it
    result = sp.execute(blob_db, "SELECT b FROM t", max_bytes=10 * 2**20)
    assert not result.ok and "result larger than" in result.error
    assert sp.execute(blob_db, "SELECT b FROM t", max_bytes=30 * 2**20).ok


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT zeroblob(200000000)",
        "SELECT b FROM big",
        "SELECT replace(hex(zeroblob(1000)), '0', hex(zeroblob(100000)))",
    ],
)
def test_a_single_oversized_value_is_refused_by_sqlite(blob_db, sql):
    start = time.perf_counter()
    result = sp.execute(blob_db, sql, max_bytes=8 * 2**20)
    assert not result.ok and "larger than" in result.error, result.error
    assert time.perf_counter() - start < 5


def test_byte_cap_fails_the_prediction_in_scoring(blob_db):
    sample = {"0": {"query": "SELECT id FROM t", "db_path": str(blob_db), "db_id": "blobs"}}
    result = sp.score_predictions([{"id": "0", "prediction": "SELECT b FROM t"}], sample, max_bytes=2**20)
    assert result["details"][0]["correct"] is False and "larger than" in result["details"][0]["error"]


def test_distinct_kept_by_default_and_stripped_like_the_official_evaluation(toy_db):
    gold, pred = "SELECT country FROM singer", "SELECT DISTINCT country FROM singer"
    sample = _sample(toy_db, gold)
    strict = sp.score_predictions([{"id": "0", "prediction": pred}], sample)
    official = sp.score_predictions([{"id": "0", "prediction": pred}], sample, keep_distinct=False)
    assert strict["details"][0]["correct"] is False and strict["keep_distinct"] is True
    assert official["details"][0]["correct"] is True
    # only the keyword goes: a string or column holding the word stays
    assert (
        sp.remove_distinct("SELECT DISTINCT name FROM t WHERE x = 'distinct'")
        == "SELECT  name FROM t WHERE x = 'distinct'"
    )


# ----------------------------------------------------------------------------- trust, second round (issue 25)

_PEAK_RSS = """
import resource, sys
from pipeline.scoring import spider as sp
r = sp.execute(sys.argv[1], sys.stdin.read(), max_bytes=int(sys.argv[2]), timeout_s=float(sys.argv[3]))
print(r.error)
# VmHWM: this process's own peak (ru_maxrss would include the forking pytest process's); and its
# children's (the query process, reaped by then): the scoring as a whole
own = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM:"))
print(max(own, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss) // 1024)
# bytes written by this process and its reaped children (temp files included), from /proc/self/io
print(next(int(line.split()[1]) for line in open("/proc/self/io") if line.startswith("wchar:")))
"""


def _peak(db, sql, max_bytes, timeout_s=10.0):
    """(error, peak RSS in MB of the scoring process and its query process, bytes they wrote) of one query."""
    out = subprocess.run(
        [sys.executable, "-c", _PEAK_RSS, str(db), str(max_bytes), str(timeout_s)],
        cwd=REPO,
        input=sql,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout.split("\n")
    return out[0], int(out[1]), int(out[2])


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT " + ", ".join(["zeroblob(30000000)"] * 8),  # each value under the cap, the row 8 times over it
        "SELECT " + ", ".join(["b"] * 40) + " FROM t",  # 40 copies of a 4 MiB value read from the table
    ],
)
def test_the_whole_result_is_capped_not_each_value(blob_db, sql):
    # one process per query: its peak memory is the query's (old code: the whole row, 240 MB, then the error)
    error, peak_mb, _ = _peak(blob_db, sql, 32 * 2**20)
    assert "result larger than" in error, error
    assert peak_mb < 160, f"peak RSS {peak_mb} MB for a 32 MiB budget"


def test_the_budget_shrinks_as_rows_arrive(blob_db):
    # 4 MiB values, two per row: the second row is refused before it is built (budget 10 MiB)
    result = sp.execute(blob_db, "SELECT b, b FROM t", max_bytes=10 * 2**20)
    assert not result.ok and "result larger than" in result.error
    assert sp.execute(blob_db, "SELECT b, b FROM t", max_bytes=41 * 2**20).ok
    # length(b) does not build b: five rows of two numbers are charged 5 * (56 + 2 * (32 + 8)) = 680 bytes
    assert sp.execute(blob_db, "SELECT id, length(b) FROM t", max_bytes=1000).rows == [(i, 4 * 2**20) for i in range(5)]


@pytest.mark.parametrize(
    "prediction",
    [
        "SELECT name FROM singer\x00",
        "\x00",
        "SELECT 'a\x00b'; DROP",
        "```sql\nSELECT\x00 1\n```",
        "SELECT '\ud800'",
        "\udcff SELECT 1",
    ],
)
def test_any_character_is_taken_as_input(toy_db, prediction):
    sp.extract_sql(prediction)
    result = sp.score_predictions([{"id": "0", "prediction": prediction}], _sample(toy_db, "SELECT name FROM singer"))
    assert result["num_samples"] == 1 and result["details"][0]["correct"] is False


def test_first_statement_agrees_with_sqlite_complete_statement():
    def reference(text):
        for m in re.finditer(";", text):
            if sqlite3.complete_statement(text[: m.end()]):
                return text[: m.end()]
        blank = re.search(r"\n[ \t]*\n", text)
        return text[: blank.start()] if blank else text

    rng = random.Random(0)
    alphabet = list(";'\"`[]-*/\n x") + ["--", "/*", "*/", "''", "SELECT ", "\n\n"]
    for _ in range(20000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 14)))
        assert sp._first_statement(text) == reference(text), text


@pytest.mark.parametrize(
    "text",
    [
        "SELECT 'a" + ";" * 240_000,
        "```x" * 60_000,
        "SELECT 1\n" * 30_000,
        "```sql\n" + "SELECT 1 -- ;\n" * 20_000,
        "'" * 240_000,
    ],
)
def test_sql_extraction_is_linear(text):
    start = time.perf_counter()
    sp.extract_sql(text)
    assert time.perf_counter() - start < 3  # a bound on the algorithm (quadratic: about 40 s), not a speed figure


def _cli(tmp_path, lines, *extra):
    preds = tmp_path / "preds.jsonl"
    preds.write_text("".join(line + "\n" for line in lines), encoding="utf-8", errors="surrogatepass")
    return subprocess.run(
        [sys.executable, "-m", "pipeline.scoring.spider", "--data", str(DATA), "--predictions", str(preds), *extra],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize(
    "lines, expect",
    [
        (['{"id": "0", "prediction": "SELECT 1"}', '{"id": "1", "prediction": "SELECT 1"', ""], ":2: not JSON"),
        (['{"id": "0", "prediction": 42}'], ":1: the prediction ('prediction') is a JSON int, not a string"),
        (['{"id": "0", "prediction": ["SELECT 1"]}'], ":1: the prediction ('prediction') is a JSON list"),
        (['["0", "SELECT 1"]'], ":1: a JSON list, not an object"),
        (['{"prediction": "SELECT 1"}'], ":1: no sample id"),
        (['{"id": "99999", "prediction": "SELECT 1"}'], "unknown Spider sample id"),
    ],
)
def test_cli_bad_predictions_file_is_one_line_and_exit_2(tmp_path, lines, expect):
    out = _cli(tmp_path, lines)
    assert out.returncode == 2 and expect in out.stderr and "Traceback" not in out.stderr, out.stderr
    assert out.stdout == ""


@pytest.mark.parametrize(
    "extra",
    [["--max-rows", "0"], ["--max-bytes", "-1"], ["--timeout", "0"], ["--timeout", "inf"], ["--max-sql-bytes", "0"]],
)
def test_cli_bad_limits_are_refused(tmp_path, extra):
    out = _cli(tmp_path, ['{"id": "0", "prediction": "SELECT 1"}'], *extra)
    assert out.returncode == 2 and extra[0] in out.stderr and "Traceback" not in out.stderr, out.stderr


def test_cli_lone_surrogate_keeps_every_result(tmp_path):
    out = _cli(
        tmp_path, ['{"id": "0", "prediction": "SELECT \\ud800"}', '{"id": "1", "prediction": "SELECT 1\\u0000"}']
    )
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["num_samples"] == 2 and result["details"][0]["sql"] == "SELECT \ud800"


# ----------------------------------------------------------------------------- trust, third round (issue 36)

_ROWS = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c LIMIT {n}) "
# one `instr` is one SQLite VM instruction: (2M - 1M) * 1M byte comparisons, about 20 s here, which neither
# the progress handler nor sqlite3_interrupt can stop (they act between instructions)
_ONE_LONG_INSTRUCTION = (
    "SELECT instr(printf('%.*c', 2000000, 'a'), printf('%.*c', 1000000, 'a') || 'b') FROM singer LIMIT 1"
)


def test_one_long_sqlite_instruction_is_stopped_at_the_deadline(toy_db):
    start = time.perf_counter()
    result = sp.execute(toy_db, _ONE_LONG_INSTRUCTION, timeout_s=1)
    assert result.timed_out and not result.ok and "timed out after 1" in result.error
    assert time.perf_counter() - start < 8  # the deadline and a process start, not the instruction's 20 s or more


def test_a_killed_query_leaves_no_process_and_the_next_query_runs(toy_db):
    with sp.QueryRunner(timeout_s=1) as runner:
        assert runner.run(toy_db, "SELECT count(*) FROM singer").rows == [(4,)]
        pid = runner._proc.pid
        assert runner.run(toy_db, _ONE_LONG_INSTRUCTION).timed_out
        with pytest.raises(ProcessLookupError):  # killed and reaped
            os.kill(pid, 0)
        assert runner.run(toy_db, "SELECT name FROM singer WHERE id = 2").rows == [("Bob",)]
    scored = sp.score_predictions(
        [{"id": "0", "prediction": _ONE_LONG_INSTRUCTION}, {"id": "1", "prediction": "SELECT count(*) FROM singer"}],
        {str(i): {"query": "SELECT count(*) FROM singer", "db_path": str(toy_db), "db_id": "toy"} for i in range(2)},
        timeout_s=1,
    )
    assert [d["timed_out"] for d in scored["details"]] == [True, False] and scored["num_correct"] == 1


_ORPHAN = """
import sys
from pipeline.scoring import spider as sp
runner = sp.QueryRunner(timeout_s=600)
print(runner._start().pid, flush=True)
runner.run(sys.argv[1], sys.argv[2])
"""


def test_the_query_process_dies_with_the_scorer(toy_db):
    # a scorer killed mid-query (a cell's timeout, a driver's ctrl-c) leaves no query running on
    scorer = subprocess.Popen(
        [sys.executable, "-c", _ORPHAN, str(toy_db), _ONE_LONG_INSTRUCTION], cwd=REPO, stdout=subprocess.PIPE, text=True
    )
    pid = int(scorer.stdout.readline())
    time.sleep(0.5)
    scorer.kill()
    scorer.wait()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except FileNotFoundError:
            break
        if "\nState:\tZ" in status:  # dead, waiting for init to reap it
            break
        time.sleep(0.1)
    else:
        os.kill(pid, 9)
        pytest.fail("the query process outlived its scorer")


def test_empty_values_and_nulls_are_charged(toy_db):
    # 99,999 rows of 500 empty blobs: no byte of payload, 50M values (old code: 400 MB and more)
    sql = _ROWS.format(n=99_999) + "SELECT " + ", ".join(["x''"] * 500) + " FROM c"
    error, peak_mb, _ = _peak(toy_db, sql, 8 * 2**20)
    assert "result larger than" in error, error
    assert peak_mb < 120, f"peak RSS {peak_mb} MB for an 8 MiB budget"
    assert sp.execute(toy_db, "SELECT NULL, x'', 1", max_bytes=56 + 3 * 32 + 8).rows == [(None, b"", 1)]
    assert not sp.execute(toy_db, "SELECT NULL, x'', 1", max_bytes=56 + 3 * 32 + 7).ok


def test_temp_storage_stays_in_capped_memory(toy_db):
    # a sort of 20,000 rows of 200 kB keys: 4 GB, which SQLite spilled to temp files (5.2 GB in 10 s)
    sql = _ROWS.format(n=20_000) + "SELECT x FROM c ORDER BY zeroblob(200000) || x"
    start = time.perf_counter()
    error, peak_mb, written = _peak(toy_db, sql, 8 * 2**20, timeout_s=20)
    assert error and "out of memory" in error, error
    assert time.perf_counter() - start < 15
    assert written < 2**20, f"{written} bytes written by a read-only query"
    assert peak_mb < sp.address_space_limit(8 * 2**20) // 2**20 + 64


def test_huge_in_list_is_refused_before_it_compiles(toy_db):
    # a 5 MB IN (...) list took 2.05 GB to compile, outside the timeout
    huge = "SELECT name FROM singer WHERE id IN (" + ", ".join(str(i) for i in range(700_000)) + ")"
    start = time.perf_counter()
    error, peak_mb, _ = _peak(toy_db, huge, 8 * 2**20, timeout_s=5)
    assert f"longer than {sp.DEFAULT_MAX_SQL_BYTES} bytes" in error, error
    assert peak_mb < 120 and time.perf_counter() - start < 10
    # under the length limit, the compile is bounded by the heap and counted in the deadline
    near = "SELECT name FROM singer WHERE id IN (" + ", ".join(str(i) for i in range(14_000)) + ")"
    assert len(near) < sp.DEFAULT_MAX_SQL_BYTES
    assert sorted(sp.execute(toy_db, near).rows) == [("Ann",), ("Bob",), ("Cid",), ("Dee",)]
    assert "longer than 1000 bytes" in sp.execute(toy_db, near, max_sql_bytes=1000).error


@pytest.mark.parametrize(
    "sql, expect",
    [
        ("SELECT " + " + ".join(["1"] * 3000), "too large"),  # expression depth (SQLITE_LIMIT_EXPR_DEPTH)
        (" UNION ".join(["SELECT 1"] * 600), "too many terms in compound SELECT"),
        ("SELECT ?1200", "variable number must be between"),
    ],
)
def test_sqlite_compile_limits(toy_db, sql, expect):
    result = sp.execute(toy_db, sql)
    assert not result.ok and expect in result.error, result.error


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"timeout_s": float("inf")}, "timeout_s"),
        ({"timeout_s": float("nan")}, "timeout_s"),
        ({"max_sql_bytes": 0}, "max_sql_bytes"),
        ({"max_bytes": 1.5}, "max_bytes"),
    ],
)
def test_bad_limits_are_refused_before_anything_runs(toy_db, kwargs, name):
    with pytest.raises(ValueError, match=name):
        sp.score_predictions([{"id": "0", "prediction": "SELECT 1"}], _sample(toy_db, "SELECT 1"), **kwargs)
