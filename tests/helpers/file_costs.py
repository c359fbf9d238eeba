"""The order in which the test files run: the costliest first, so that the xdist workers finish together.

``make test`` runs pytest-xdist with ``--dist loadfile``: one file is one work unit, handed to whichever worker
runs short, in the order of the work queue. A long file that starts late leaves the other worker idle at the end
(longest-processing-time-first scheduling: sorting the units by cost, longest first, bounds that idle tail by the
shortest file's cost instead of the longest's). ``tests/file_costs.json`` holds each file's measured seconds (the
sum of its tests' times in a junit report; today's table is from ``make test`` itself, three workers on two cores,
where the Ray files run 2-3x their one-core time and the others 1.1-1.4x: it orders the files, nothing else);
``tests/conftest.py`` sorts the collected items by it, and turns off xdist's own reordering
(``--loadscope-reorder``, on by default in pytest-xdist 3.x: units sorted by their number of tests, which put the
sweep tests' few long tests last).

Refresh the table after a change in the suite's costs::

    make test ARGS=--junitxml=/tmp/suite.xml
    python -m helpers.file_costs /tmp/suite.xml      # from tests/: rewrites tests/file_costs.json
"""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path
from typing import Callable, Sequence, TypeVar

from helpers.paths import REPO

TABLE = REPO / "tests" / "file_costs.json"
UNKNOWN = float("inf")  # a file not in the table (new) runs first: its cost is unknown, so it must not end the run

T = TypeVar("T")


def load(path: Path = TABLE) -> dict[str, float]:
    """File (relative to the repository root, e.g. ``tests/test_sweep.py``) -> seconds; empty without a table."""
    return json.loads(path.read_text()) if path.exists() else {}


def ordered(items: Sequence[T], file_of: Callable[[T], str], costs: dict[str, float]) -> list[T]:
    """``items`` grouped by file, files by decreasing cost (unknown ones first), ties in collection order; the
    items of one file keep their order (module fixtures stay one setup per file)."""
    first: dict[str, int] = {}
    for i, item in enumerate(items):
        first.setdefault(file_of(item), i)
    return sorted(items, key=lambda item: (-costs.get(file_of(item), UNKNOWN), first[file_of(item)]))


def from_junit(xml_path: Path) -> dict[str, float]:
    """Seconds per file (setup, call and teardown of its tests) from pytest's ``--junitxml`` report."""
    per: Counter[str] = Counter()
    for case in ET.parse(xml_path).iter("testcase"):
        parts = (case.get("classname") or "").split(".")  # tests.test_x or tests.test_x.TestClass
        module = next((i for i, part in enumerate(parts) if part.startswith("test_")), None)
        if module is not None:  # an interrupted run's last test case names none
            per["/".join(parts[: module + 1]) + ".py"] += float(case.get("time") or 0)
    return {name: round(per[name], 1) for name in sorted(per)}


def main(argv: list[str]) -> int:
    (xml_path,) = argv
    TABLE.write_text(json.dumps(from_junit(Path(xml_path)), indent=1, sort_keys=True) + "\n")
    print(f"wrote {TABLE}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
