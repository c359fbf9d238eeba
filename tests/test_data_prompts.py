"""Prompt formatting per pair: chat template for chat models, the dataset's continuation for base models."""

from __future__ import annotations

import pytest

from helpers.paths import DATA
from helpers.tokenizers import offline_tokenizer
from pipeline.data import format_sample, load_dataset, prediction_text
from pipeline.data.base import Sample, chat_messages


@pytest.fixture(scope="module")
def tokenizer():
    return offline_tokenizer()


def test_chat_template_and_recorded_style(tokenizer):
    sample = load_dataset("humaneval", limit=1)[0]
    prompt = format_sample(sample, tokenizer, chat=True)
    assert prompt.style == "chat"
    assert prompt.text.startswith("<|im_start|>") and prompt.text.endswith("<|im_start|>assistant\n")
    assert "```python" in prompt.text and sample.reference["prompt"] in prompt.text
    assert prompt.input_ids == tokenizer(prompt.text, add_special_tokens=False)["input_ids"]


def test_humaneval_continuation_is_the_raw_prompt(tokenizer):
    sample = load_dataset("humaneval", limit=1)[0]
    prompt = format_sample(sample, tokenizer, chat=False)
    assert prompt.style == "continuation" and prompt.text == sample.reference["prompt"]
    assert prediction_text(prompt, "    return True\n") == "    return True\n"


def test_spider_prompts_have_schema_and_question(tokenizer):
    sample = load_dataset("spider", DATA / "spider", limit=1)[0]
    base = format_sample(sample, tokenizer, chat=False)
    assert base.text.startswith("CREATE TABLE") and sample.turns[0] in base.text and base.text.endswith("SELECT")
    assert prediction_text(base, " count(*) FROM singer") == "SELECT count(*) FROM singer"
    chat = format_sample(sample, tokenizer, chat=True)
    assert "CREATE TABLE" in chat.text and "```sql" in chat.text and chat.answer_prefix == ""


def test_second_turn_sees_the_first_answer(tokenizer):
    sample = Sample(id="1", dataset="mt_bench", turns=["First question?", "Second question?"], category="writing")
    chat = format_sample(sample, tokenizer, chat=True, turn=1, answers=["FIRST ANSWER"])
    assert chat.text.index("First question?") < chat.text.index("FIRST ANSWER") < chat.text.index("Second question?")
    base = format_sample(sample, tokenizer, chat=False, turn=1, answers=["FIRST ANSWER"])
    assert base.text == "User: First question?\n\nAssistant: FIRST ANSWER\n\nUser: Second question?\n\nAssistant:"
    with pytest.raises(ValueError, match="previous answer"):
        chat_messages(sample, turn=1, answers=[])
    with pytest.raises(ValueError, match="turn"):
        chat_messages(sample, turn=2, answers=["a", "b"])


def test_chat_pair_without_template_is_a_clear_error(tokenizer):
    class NoTemplate:
        chat_template = None

    sample = Sample(id="1", dataset="chatgpt_prompts", turns=["Hi"])
    with pytest.raises(ValueError, match="chat: false"):
        format_sample(sample, NoTemplate(), chat=True)
