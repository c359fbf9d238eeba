"""The one prompt-encoding path: chat prompts, continuation prompts and EOS ids.

Every part of the pipeline that turns text into token ids goes through here, so the benchmark
(``pipeline.bench``), ``pipeline.generate``, a sweep cell (``pipeline.data.format_prompt``) and the
training tools (``pipeline.training``) feed a model the same ids for the same prompt:

- chat: the tokenizer's chat template rendered to text with the generation prompt, then tokenised
  without adding special tokens (the template writes them);
- continuation (base models): the text tokenised as the tokenizer does by default (it adds BOS
  where the model expects one).
"""

from __future__ import annotations

from typing import Any, Sequence

Messages = Sequence[dict[str, str]]


def encode_chat(tokenizer: Any, messages: Messages) -> tuple[str, list[int]]:
    """(text, ids) of ``messages`` through the chat template, ending with the assistant's turn opening."""
    if getattr(tokenizer, "chat_template", None) is None:
        raise ValueError(
            "the pair is configured as a chat pair but its tokenizer has no chat template; "
            "set `chat: false` in the pair config to use continuation prompts"
        )
    text = tokenizer.apply_chat_template(list(messages), tokenize=False, add_generation_prompt=True)
    return text, [int(t) for t in tokenizer(text, add_special_tokens=False)["input_ids"]]


def encode_continuation(tokenizer: Any, text: str) -> list[int]:
    """Ids of a plain-text prompt for a base model (the tokenizer adds BOS where the model expects it)."""
    return [int(t) for t in tokenizer(text)["input_ids"]]


def encode_prompt(tokenizer: Any, prompt: str | Messages, chat: bool) -> list[int]:
    """A user prompt (a string, or chat messages) as ids: the chat template for chat pairs, else plain text."""
    if chat:
        messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
        return encode_chat(tokenizer, messages)[1]
    text = prompt if isinstance(prompt, str) else "\n".join(m["content"] for m in prompt)
    return encode_continuation(tokenizer, text)


def chat_ids(tokenizer: Any, user: str, answer: str | None = None) -> list[int]:
    """A single-turn chat prompt's ids, followed by ``answer``'s ids and EOS when given (training data)."""
    ids = encode_prompt(tokenizer, user, chat=True)
    if answer is not None:
        ids += [int(t) for t in tokenizer(answer, add_special_tokens=False)["input_ids"]] + [tokenizer.eos_token_id]
    return ids


def eos_ids(tokenizer: Any, model: Any) -> list[int]:
    """EOS ids from the tokenizer and the model's generation config."""
    ids = set()
    for source in (tokenizer.eos_token_id, getattr(model.generation_config, "eos_token_id", None)):
        if source is None:
            continue
        ids.update(source if isinstance(source, (list, tuple)) else [source])
    return sorted(ids)
