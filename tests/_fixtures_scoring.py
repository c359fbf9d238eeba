"""Helpers for the measurement and scoring tests (imported by them; conftest.py belongs to the lead)."""

from __future__ import annotations

from helpers.paths import REPO

DATA = REPO / "data"  # the project's own offline copy (data/README.md)
