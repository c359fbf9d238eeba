"""The one prompt-encoding path: chat prompts, continuation prompts and EOS ids.

Every part of the pipeline that turns text into token ids goes through here, so the benchmark
(``pipeline.bench``), ``pipeline.generate``, a sweep cell (``pipeline.data.format_prompt``) and the
training tools (``pipeline.training``) feed a model the same ids for the same prompt:

- chat: the tokenizer's chat template rendered to text with the generation prompt, then tokenised
  without adding special tokens (the template writes them);
- continuation (base models): the text tokenised as the tokenizer does by default (it adds BOS
  where the model expects one).

Control strings (the tokenizer's special tokens: ``<|im_start|>``, ``<|im_end|>``, ``</s>``, ...) are
control tokens only where the chat template writes them: inside a message's content, an answer or a
continuation prompt they are tokenised as the text they are, so a dataset prompt cannot forge a turn
or an end of sequence. Text without control strings gets exactly the ids it always had.
"""

from __future__ import annotations

from typing import Any, Sequence

Messages = Sequence[dict[str, str]]
_SENTINEL = "\ue000pipeline-message-{}\ue001"  # private-use characters: never in a template or a prompt


def control_strings(tokenizer: Any) -> list[str]:
    """The tokenizer's special tokens as text, longest first (what its parser turns into control ids)."""
    found = {str(t) for t in getattr(tokenizer, "all_special_tokens", []) or []}
    decoder = getattr(tokenizer, "added_tokens_decoder", None) or {}
    found |= {str(t) for t in decoder.values() if getattr(t, "special", False)}
    return sorted((t for t in found if t), key=len, reverse=True)


def _has_control(tokenizer: Any, *texts: Any) -> bool:
    controls = control_strings(tokenizer)
    return any(isinstance(t, str) and any(c in t for c in controls) for t in texts)


def as_text_ids(tokenizer: Any, text: str, add_special_tokens: bool = False) -> list[int]:
    """Ids of ``text`` with any control string in it tokenised as text (``split_special_tokens``)."""
    if not _has_control(tokenizer, text):
        return [int(t) for t in tokenizer(text, add_special_tokens=add_special_tokens)["input_ids"]]
    return [
        int(t) for t in tokenizer(text, add_special_tokens=add_special_tokens, split_special_tokens=True)["input_ids"]
    ]


def _render(tokenizer: Any, messages: Messages) -> str:
    return tokenizer.apply_chat_template(list(messages), tokenize=False, add_generation_prompt=True)


def _template_layout(tokenizer: Any, messages: Messages) -> tuple[str, list[tuple[int, int]]]:
    """(text, spans of the template's own text in it): the template rendered around sentinel contents
    locates each message's content; the real contents go back in as the template wrote them (as is, or
    trimmed, whichever reproduces the template's own rendering; as is when neither does)."""
    marked = [
        dict(m, content=_SENTINEL.format(i)) if isinstance(m.get("content"), str) else dict(m)
        for i, m in enumerate(messages)
    ]
    layout = _render(tokenizer, marked)
    pieces: list[tuple[str, int | None]] = []  # (template text, None) or ("", message index)
    rest = layout
    for i in range(len(messages)):
        sentinel = _SENTINEL.format(i)
        if sentinel not in rest:
            continue  # the template left this message out
        before, rest = rest.split(sentinel, 1)
        pieces += [(before, None), ("", i)]
    pieces.append((rest, None))

    def assemble(transform) -> tuple[str, list[tuple[int, int]]]:
        text, spans = "", []
        for piece, index in pieces:
            if index is None:
                spans.append((len(text), len(text) + len(piece)))
                text += piece
            else:
                text += transform(messages[index]["content"])
        return text, spans

    wanted = _render(tokenizer, messages)
    for transform in (lambda c: c, str.strip):
        text, spans = assemble(transform)
        if text == wanted:
            return text, spans
    # the template rewrites contents in another way: the contents as given, between its own text
    return assemble(lambda c: c)


def _ids_with_template_controls(tokenizer: Any, text: str, template_spans: list[tuple[int, int]]) -> list[int]:
    """Control strings are control ids only inside the template's own text; everything between them is
    tokenised as text (so the result equals the usual tokenisation when the contents hold no control string)."""
    controls = control_strings(tokenizer)
    honored: list[tuple[int, int, str]] = []
    for start, end in template_spans:
        i = start
        while i < end:
            token = next((c for c in controls if text.startswith(c, i) and i + len(c) <= end), None)
            if token is None:
                i += 1
                continue
            honored.append((i, i + len(token), token))
            i += len(token)
    ids: list[int] = []
    cursor = 0
    for start, end, token in honored:
        if start > cursor:
            ids += as_text_ids(tokenizer, text[cursor:start])
        ids.append(int(tokenizer.convert_tokens_to_ids(token)))
        cursor = end
    if cursor < len(text):
        ids += as_text_ids(tokenizer, text[cursor:])
    return ids


def encode_chat(tokenizer: Any, messages: Messages) -> tuple[str, list[int]]:
    """(text, ids) of ``messages`` through the chat template, ending with the assistant's turn opening."""
    if getattr(tokenizer, "chat_template", None) is None:
        raise ValueError(
            "the pair is configured as a chat pair but its tokenizer has no chat template; "
            "set `chat: false` in the pair config to use continuation prompts"
        )
    if not _has_control(tokenizer, *(m.get("content") for m in messages)):
        text = _render(tokenizer, messages)
        return text, [int(t) for t in tokenizer(text, add_special_tokens=False)["input_ids"]]
    text, spans = _template_layout(tokenizer, messages)
    return text, _ids_with_template_controls(tokenizer, text, spans)


def encode_continuation(tokenizer: Any, text: str) -> list[int]:
    """Ids of a plain-text prompt for a base model (the tokenizer adds BOS where the model expects it;
    control strings in the text are text)."""
    return as_text_ids(tokenizer, text, add_special_tokens=True)


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
        ids += as_text_ids(tokenizer, answer) + [tokenizer.eos_token_id]
    return ids


def eos_ids(tokenizer: Any, model: Any) -> list[int]:
    """EOS ids from the tokenizer and the model's generation config."""
    ids: set[int] = set()
    for source in (tokenizer.eos_token_id, getattr(model.generation_config, "eos_token_id", None)):
        if source is None:
            continue
        ids.update(source if isinstance(source, (list, tuple)) else [source])
    return sorted(ids)
