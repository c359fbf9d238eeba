"""Evaluation pipeline for fast LLM decoding methods (see README.md and docs/DESIGN.md)."""

__version__ = "0.1.0"
