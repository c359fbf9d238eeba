"""Evaluation pipeline for fast LLM decoding methods (see README.md and DESIGN.md)."""

__version__ = "0.1.0"
