"""Helpers for the measurement and scoring tests (imported by them; conftest.py belongs to the lead)."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "data"  # the project's own offline copy (data/README.md)
