"""The repository's paths, defined once for every test."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CONF = REPO / "conf"
DATA = REPO / "data"
