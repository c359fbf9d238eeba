"""Test helpers (no tests here): tiny models, tokenizers, exact laws, a sweep project on disk.

models.py      tiny_llama: the one factory of tiny random causal LMs
tokenizers.py  the offline pair's tokenizer and a small word-level one with a chat template
exact.py       exact laws by enumeration and the chi-square test against them
paths.py       REPO, CONF, DATA: the repository's paths, defined once
marks.py       needs_kernels, require_kernels: the bf16 kernels' skip mark and check, defined once
project.py     a project folder (conf/ + tiny models + data) for sweeps, and how to run one
cells.py       make_cell: a Cell built by hand (tracking and analysis tests)
teacher.py     small_chat_run: the teacher data's settings for a generation of a second or two
judge.py       an OpenAI-compatible judge server on loopback (MT-Bench scoring, the sweep's judge stage)
vendor/        third-party test code kept as published (Spec-Bench's speed())
"""
