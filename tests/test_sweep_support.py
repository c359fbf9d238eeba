"""Helpers for the sweep, cell and tracking tests (no tests here): a tiny pair on disk and a conf/ copy.

``make_project(tmp)`` writes a tiny random Llama target and draft (``save_pretrained``) with an offline
WordLevel tokenizer wrapped in ``PreTrainedTokenizerFast`` (with a chat template), a tiny MT-Bench-format
question file, and a copy of the repository's ``conf/`` extended with ``pair/tiny.yaml``,
``dataset/tiny_mt.yaml`` and ``sweep/tiny.yaml``. Cells on it take a second or two of compute.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }} </s> {% endfor %}"
    "{% if add_generation_prompt %}<|assistant|> {% endif %}"
)
WORDS = (
    "def return if else for in range the a of to and is x y n list int str print import "
    "write function python number numbers value values true false none"
).split()


def make_tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = ["[UNK]", "<s>", "</s>", "<|user|>", "<|assistant|>", "<|system|>"]
    words = list(dict.fromkeys(specials + WORDS + [chr(c) for c in range(33, 127)]))
    vocab = {w: i for i, w in enumerate(words)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Punctuation()])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", bos_token="<s>", eos_token="</s>")
    fast.chat_template = CHAT_TEMPLATE
    return fast


def make_model(vocab_size: int, seed: int, layers: int):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab_size, hidden_size=16, num_hidden_layers=layers, num_attention_heads=2,
        num_key_value_heads=1, intermediate_size=32, max_position_embeddings=4096,
        bos_token_id=1, eos_token_id=2, pad_token_id=None,
    )
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)
    return model


def make_project(root: Path) -> Path:
    """A project folder (conf/ + models/ + data/) for sweeps on tiny models; returns it."""
    root = Path(root)
    if (root / "conf" / "sweep" / "tiny.yaml").exists():
        return root
    tok = make_tokenizer()
    for name, seed, layers in (("target", 0, 2), ("draft", 0, 1)):  # draft = target's first layer: acceptance > 0
        model = make_model(len(tok), seed, layers)
        model.save_pretrained(root / "models" / name)
        tok.save_pretrained(root / "models" / name)
    data = root / "data" / "tiny_mt"
    data.mkdir(parents=True)
    rows = [
        {"question_id": 100 + i, "category": "writing", "turns": [f"write a python function {i}", "return the value"]}
        for i in range(6)
    ]
    (data / "question.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    shutil.copytree(REPO / "conf", root / "conf")
    (root / "conf" / "pair" / "tiny.yaml").write_text(
        "name: tiny\nchat: true\ndtype: float32\ndevice: cpu\n"
        f"target:\n  id: {root / 'models' / 'target'}\ndraft:\n  id: {root / 'models' / 'draft'}\n"
    )
    (root / "conf" / "dataset" / "tiny_mt.yaml").write_text(
        "name: mt_bench\npath: data/tiny_mt\nsplit: null\nstart: 0\nlimit: 2\nids: null\n"
        "max_new_tokens: 8\nmax_turns: null\ntime_budget_s: null\noptions: {}\n"
    )
    (root / "conf" / "sweep" / "tiny.yaml").write_text(
        "# @package _global_\n"
        "sweep:\n  name: tiny\n  methods: [spd, block]\n  method_overrides: {}\n  baseline: ar\n"
        "  pairs: [tiny]\n"
        "  datasets: [{dataset: humaneval, limit: 2, max_new_tokens: 8}, tiny_mt]\n"
        "  seeds: [0]\n"
        "measure: {warmup_generations: 1, warmup_seconds: 0.0, warmup_samples: 1, idle_seconds: 0.0, energy_meter: none}\n"
        "cluster: {cell_timeout_s: 300, max_in_flight: 2}\n"
    )
    return root


def overrides(root: Path, *extra: str) -> list[str]:
    """Overrides that keep MLflow inside ``root`` and the output quiet."""
    return [
        "sweep=tiny",
        f"tracking.uri=sqlite:///{root}/mlflow.db",
        f"tracking.artifact_root={root}/mlruns",
        "progress=false",
        *extra,
    ]


def run_sweep(root: Path, *extra: str):
    from pipeline import sweep

    cfg = sweep.compose(overrides(root, *extra), root / "conf")
    return sweep.run(cfg, root=root)
