"""The check that refuses evaluation prompts in training data (run before any model loads).

Training prompts are written by the project (``prompt_sets``, ``chat_mix``), so none *should* come from
an evaluation set; this makes it a checked fact rather than a promise. Every user turn of the evaluation
sets the project ships or installs (MT-Bench, Spec-Bench, the CNN/DailyMail sample, Spider's questions,
HumanEval's prompts, the bench's own prompts in ``conf/bench.yaml``) is normalised (lower case, words
only) and cut into word 13-grams, the contamination unit of GPT-3's and Llama's data reports; a training
prompt that shares one of them with an evaluation prompt, or equals a shorter one whole, is refused.
"""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path
from typing import Any, Iterable

from omegaconf import OmegaConf

from pipeline.data import humaneval
from pipeline.data.base import read_json_records
from pipeline.training.common import repo_path

NGRAM = 13
_WORD = re.compile(r"[a-z0-9]+")


def words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


def ngrams(text: str, n: int = NGRAM) -> set[tuple[str, ...]]:
    w = words(text)
    return {tuple(w[i : i + n]) for i in range(len(w) - n + 1)}


def evaluation_prompts(data_root: str | Path | None = None) -> dict[str, list[str]]:
    """Every evaluation user turn the project can run, by set (files missing under ``data_root`` are skipped:
    a set that is not here cannot be trained on from here either)."""
    root = repo_path(data_root or "data")
    out: dict[str, list[str]] = {}
    for name, rel in (("mt_bench", "mt_bench/question.jsonl"), ("spec_bench", "spec_bench/question.jsonl")):
        if (root / rel).exists():
            out[name] = [t for r in read_json_records(root / rel) for t in r["turns"]]
    cnn = root / "cnn_dailymail_sample" / "specbench_cnndm_80.jsonl"
    if cnn.exists():
        out["cnn_dm"] = [r["article"] for r in read_json_records(cnn)]
    spider = root / "spider" / "dev.json"
    if spider.exists():
        out["spider"] = [r["question"] for r in json.loads(spider.read_text())]
    out["humaneval"] = [s.turns[0] for s in humaneval.load()]
    bench = repo_path("conf/bench.yaml")
    if bench.exists():
        bench_cfg: Any = OmegaConf.load(bench)  # a mapping (conf/bench.yaml)
        out["bench"] = [str(p) for p in bench_cfg.get("prompts") or []]
    return out


@functools.cache
def _index(data_root: str | None) -> tuple[dict[tuple[str, ...], str], dict[str, str]]:
    grams: dict[tuple[str, ...], str] = {}
    short: dict[str, str] = {}
    for name, texts in evaluation_prompts(data_root).items():
        for t in texts:
            w = words(t)
            if len(w) < NGRAM:
                if w:
                    short.setdefault(" ".join(w), name)
            else:
                for g in ngrams(t):
                    grams.setdefault(g, name)
    return grams, short


def contaminated(prompts: Iterable[str], data_root: str | Path | None = None) -> list[tuple[str, str, str]]:
    """(training prompt, evaluation set, shared text) for every prompt that overlaps an evaluation prompt."""
    grams, short = _index(str(data_root) if data_root is not None else None)
    hits = []
    for p in prompts:
        w = words(p)
        joined = " ".join(w)
        if joined in short:
            hits.append((p, short[joined], joined))
            continue
        for i in range(len(w) - NGRAM + 1):
            g = tuple(w[i : i + NGRAM])
            if g in grams:
                hits.append((p, grams[g], " ".join(g)))
                break
    return hits


def refuse_evaluation_prompts(prompts: Iterable[str], data_root: str | Path | None = None) -> None:
    """Raise ``ValueError`` naming the overlap when any training prompt shares text with an evaluation prompt."""
    hits = contaminated(prompts, data_root)
    if hits:
        shown = "; ".join(f"{s}: {t[:80]!r} shares {g!r}" for t, s, g in hits[:3])
        raise ValueError(
            f"{len(hits)} training prompt(s) overlap evaluation prompts ({shown}): remove them from the prompt "
            "templates (pipeline/training/chat_mix.py, prompt_sets.py); evaluation sets are never trained on"
        )
