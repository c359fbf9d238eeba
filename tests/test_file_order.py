"""The order of the test files (tests/helpers/file_costs.py): the costliest first, so that xdist's workers end
together; each file's tests keep their order."""

from __future__ import annotations

from pathlib import Path

from helpers import file_costs
from helpers.paths import REPO


def test_files_run_costliest_first_unknown_ones_before_all_and_a_files_tests_keep_their_order():
    items = ["a::1", "b::1", "a::2", "c::1", "d::1", "b::2", "e::1"]
    costs = {"a": 5.0, "b": 30.0, "c": 5.0, "e": 1.0}  # d is new: not in the table
    got = file_costs.ordered(items, lambda i: i.split("::")[0], costs)
    assert got == ["d::1", "b::1", "b::2", "a::1", "a::2", "c::1", "e::1"]
    assert file_costs.ordered(items, lambda i: i.split("::")[0], {}) == [
        "a::1",
        "a::2",
        "b::1",
        "b::2",
        "c::1",
        "d::1",
        "e::1",
    ]  # no table: files in collection order (each one's tests together)


def test_this_session_runs_in_the_tables_order(request):
    files = list(dict.fromkeys(item.nodeid.split("::", 1)[0] for item in request.session.items))
    costs = file_costs.load()
    assert files == sorted(files, key=lambda f: -costs.get(f, file_costs.UNKNOWN))
    if hasattr(request.config.option, "loadscopereorder"):  # pytest-xdist installed
        assert request.config.option.loadscopereorder is False  # its queue keeps this order


def test_the_table_names_existing_test_files_only():
    costs = file_costs.load()
    assert costs, "tests/file_costs.json is missing or empty"
    assert all(cost >= 0 for cost in costs.values())
    missing = [name for name in costs if not (REPO / name).is_file() or not Path(name).name.startswith("test_")]
    assert not missing, f"stale entries in tests/file_costs.json: {missing}"


def test_the_table_is_read_from_pytests_junit_report(tmp_path):
    xml = tmp_path / "suite.xml"
    xml.write_text(
        '<testsuites><testsuite name="pytest">'
        '<testcase classname="tests.test_a" name="t1" time="1.5"/>'
        '<testcase classname="tests.test_a.TestGroup" name="t2" time="2.0"/>'
        '<testcase classname="tests.test_b" name="t3" time="0.5"><skipped/></testcase>'
        '<testcase time="9.0"/>'  # interrupted
        "</testsuite></testsuites>"
    )
    assert file_costs.from_junit(xml) == {"tests/test_a.py": 3.5, "tests/test_b.py": 0.5}
