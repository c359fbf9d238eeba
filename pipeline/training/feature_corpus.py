"""The feature corpus of the Medusa and EAGLE heads: standard-library source shown as chat answers and the target's
sampled answers, as token sequences and the target's hidden states over them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from pipeline.prompts import chat_ids
from pipeline.training.prompt_sets import feature_prompts, stdlib_chunks
from pipeline.training.teacher_data import left_pad, padding_id


@torch.no_grad()
def generate_answers(
    model, tokenizer, prompts: list[str], max_new_tokens: int, batch_size: int, seed: int, log
) -> list[list[int]]:
    """The target's sampled answers (prompt + answer ids), T=1 top-k 10 top-p 0.9, batched with left padding."""
    torch.manual_seed(seed)
    pad = padding_id(tokenizer)
    out = []
    for b in range(0, len(prompts), batch_size):
        batch = [chat_ids(tokenizer, p) for p in prompts[b : b + batch_size]]
        ids, mask = left_pad(batch, pad)
        width = ids.shape[1]
        gen = model.generate(
            input_ids=ids,
            attention_mask=mask,
            do_sample=True,
            temperature=1.0,
            top_k=10,
            top_p=0.9,
            max_new_tokens=max_new_tokens,
            pad_token_id=pad,
        )
        for x, row in zip(batch, gen[:, width:].tolist()):
            eos = tokenizer.eos_token_id
            answer = row[: row.index(eos) + 1] if eos in row else row
            out.append(x + [t for t in answer if t != pad or t == eos])
        log(f"sampled answers {min(b + batch_size, len(prompts))}/{len(prompts)}")
    return out


@torch.no_grad()
def hidden_states(model, sequences: list[list[int]], log, tag: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Concatenated last hidden states ``[N, H]`` (fp32), token ids ``[N]`` and sequence ids ``[N]``."""
    hs, ids, seq = [], [], []
    backbone = model.get_decoder()
    for i, s in enumerate(sequences):
        x = torch.tensor([s])
        hs.append(backbone(input_ids=x).last_hidden_state[0].float())
        ids.append(x[0])
        seq.append(torch.full((len(s),), i))
        if (i + 1) % 20 == 0:
            log(f"hidden states [{tag}] {i + 1}/{len(sequences)}")
    return torch.cat(hs), torch.cat(ids), torch.cat(seq)


def feature_data(
    model, tokenizer, data_cfg: dict[str, Any], seed: int, cache: Path, log
) -> dict[str, tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """The offline training/held-out text and the frozen target's last hidden states over it (cached in ``cache``).

    Tags ``train`` (stdlib source + the target's sampled answers), ``heldout_stdlib``, ``heldout_answers``;
    each ``(hidden [N, H], token ids [N], sequence ids [N])`` (``hidden_states``). Used by Medusa and EAGLE training.
    """
    if cache.exists():
        log(f"loaded cached data {cache}")
        return torch.load(cache)
    data = {
        tag: hidden_states(model, seqs, log, tag)
        for tag, seqs in feature_sequences(model, tokenizer, data_cfg, seed, log).items()
    }
    torch.save(data, cache)
    log("data: " + ", ".join(f"{k} {v[0].shape[0]} tokens" for k, v in data.items()))
    return data


def feature_sequences(model, tokenizer, data_cfg: dict[str, Any], seed: int, log) -> dict[str, list[list[int]]]:
    """The token sequences of the feature corpus by tag (``train``, ``heldout_stdlib``, ``heldout_answers``):
    what ``feature_data`` runs the target over (EAGLE-3 training reads other layers of the same text)."""
    train_prompts, held_prompts = feature_prompts(seed)
    train_prompts = train_prompts[: data_cfg["n_prompts"]]
    held_prompts = held_prompts[: data_cfg["n_heldout_prompts"]]
    src_train, src_held = stdlib_chunks(
        data_cfg["n_stdlib_files"], data_cfg["n_heldout_stdlib_files"], data_cfg["stdlib_chars"], seed
    )
    limit = data_cfg["max_len"]
    seqs_train = [chat_ids(tokenizer, f"Show me the code of {p}.", c)[:limit] for p, c in src_train]
    seqs_held = [chat_ids(tokenizer, f"Show me the code of {p}.", c)[:limit] for p, c in src_held]
    gen_train = generate_answers(
        model, tokenizer, train_prompts, data_cfg["max_new_tokens"], data_cfg["batch_size"], seed, log
    )
    gen_held = generate_answers(
        model, tokenizer, held_prompts, data_cfg["max_new_tokens"], data_cfg["batch_size"], seed + 1, log
    )
    return {"train": seqs_train + gen_train, "heldout_stdlib": seqs_held, "heldout_answers": gen_held}
