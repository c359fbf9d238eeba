"""Tokenizers for tests: the offline pair's (SmolLM2, with its chat template) and a tiny word-level one."""

from __future__ import annotations

from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from pipeline import models as pipeline_models

CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }} </s> {% endfor %}"
    "{% if add_generation_prompt %}<|assistant|> {% endif %}"
)
WORDS = (
    "def return if else for in range the a of to and is x y n list int str print import "
    "write function python number numbers value values true false none"
).split()


def word_tokenizer():
    """A word-level tokenizer over ``WORDS`` and printable ASCII, with a chat template (offline)."""
    specials = ["[UNK]", "<s>", "</s>", "<|user|>", "<|assistant|>", "<|system|>"]
    words = list(dict.fromkeys(specials + WORDS + [chr(c) for c in range(33, 127)]))
    vocab = {w: i for i, w in enumerate(words)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Punctuation()])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", bos_token="<s>", eos_token="</s>")
    fast.chat_template = CHAT_TEMPLATE
    return fast


def offline_tokenizer():
    """The offline pair's tokenizer (SmolLM2-135M-Instruct, with its chat template)."""
    spec = pipeline_models.ModelSpec.from_config(pipeline_models.pair_config("smollm2-offline")["target"])
    return pipeline_models.load_tokenizer(spec)
