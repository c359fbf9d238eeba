"""The held-out sets of a distillation run and the alpha measured on them (``pipeline.training.distill``).

The held-out prompts are HumanEval and MT-Bench first turns (never trained on) and, optionally, conversations
of the chat mix's held-out split; the target answers them (T=1, top-k 10, top-p 0.9) and its *warped*
next-token rows are kept, against which the student's alpha is measured.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, cast

import torch

from pipeline.data import humaneval
from pipeline.decoding.kv import CachedModel
from pipeline.decoding.warping import warp
from pipeline.prompts import chat_ids
from pipeline.training.chat_mix import Conversation
from pipeline.training.common import repo_path
from pipeline.training.shards import save_atomic
from pipeline.training.teacher_data import (
    chat_heldout_conversations,
    padding_id,
    sample_answers,
    sample_answers_packed,
    sample_conversations,
)

WARP: dict[str, Any] = dict(temperature=1.0, top_k=10, top_p=0.9)


def heldout_prompts(n_humaneval: int, n_mtbench: int, mt_bench_path: str | None) -> list[str]:
    """First-turn user texts of evenly spaced HumanEval and MT-Bench samples (never trained on)."""
    out = []
    if n_humaneval:
        samples = humaneval.load()
        step = max(1, len(samples) // n_humaneval)
        out += [humaneval.chat_user_texts(s)[0] for s in samples[::step][:n_humaneval]]
    if n_mtbench:
        if not mt_bench_path:
            raise ValueError("held-out MT-Bench prompts need heldout.mt_bench_path (a question.jsonl)")
        path = repo_path(mt_bench_path)
        if not path.exists():
            raise ValueError(f"{path} not found: set heldout.mt_bench_path or PIPELINE_DATA_ROOT")
        rows = [json.loads(l) for l in path.read_text().splitlines() if l.strip()]
        step = max(1, len(rows) // n_mtbench)
        out += [r["turns"][0] for r in rows[::step][:n_mtbench]]
    return out


@torch.no_grad()
def build_heldout(
    target,
    tokenizer,
    prompts: list[str] | list[Conversation],
    *,
    max_new_tokens: int,
    seed: int,
    batch_size: int = 16,
    engine: str = "batched",
) -> dict:
    """Target-sampled answers (eval warping) and the target's warped top-k rows at every answer position
    (``engine`` as ``teacher_data.generate_teacher_data``'s). ``prompts``: single user turns, or chat-mix
    conversations whose every turn is answered after the target's own earlier answers (all turns' rows count)."""
    gen = torch.Generator().manual_seed(seed)
    pad = padding_id(tokenizer)
    cached = CachedModel(target) if engine == "packed" else None
    kw = dict(
        max_new_tokens=max_new_tokens,
        top_k_store=1,
        sample_top_k=WARP["top_k"],
        sample_top_p=WARP["top_p"],
        eos_id=tokenizer.eos_token_id,
        gen=gen,
    )

    def sample(batch: list[list[int]]) -> list:
        if cached is not None:  # packed: one continuous batch
            return sample_answers_packed(cached, batch, **kw)
        return [
            r
            for i in range(0, len(batch), batch_size)
            for r in sample_answers(target, batch[i : i + batch_size], pad_id=pad, **kw)
        ]

    shown: list[Any]
    if prompts and isinstance(prompts[0], Conversation):
        recs = sample_conversations(tokenizer, list(prompts), sample)
        shown = [list(c.turns) for c in prompts]
    else:
        texts = cast(list[str], prompts)  # single user turns
        recs = sample([chat_ids(tokenizer, p) for p in texts])
        shown = list(texts)
    seqs = [(r.ids.long(), r.start) for r in recs]
    rows = []
    for ids, start in seqs:
        if cached is not None:
            cached.reset()
            logits = cached.forward(ids, keep=0)[start - 1 : len(ids) - 1]
        else:
            logits = target(ids[None]).logits[0, start - 1 : len(ids) - 1]
        p = warp(logits.float(), **WARP)
        vals, idx = p.topk(WARP["top_k"], dim=-1)
        rows.append({"ids": ids, "start": start, "p_ids": idx, "p": vals, "argmax": logits.argmax(-1)})
    return {"prompts": shown, "rows": rows}


@torch.no_grad()
def evaluate_alpha(student, heldout: dict, token_map: torch.Tensor | None) -> dict[str, float]:
    """alpha = mean over held-out answer positions of sum_v min(p_v, q_v) (warped rows) and greedy agreement.

    With ``token_map``, the student's logits cover only the mapped ids (-inf elsewhere), as in the engine.
    """
    was_training = student.training
    student.eval()
    emb = student.get_input_embeddings().weight
    head = emb if token_map is None else emb[token_map]
    tot_a = tot_g = n = 0.0
    for row in heldout["rows"]:
        ids, start = row["ids"], row["start"]
        h = student.model(ids[None]).last_hidden_state[0, start - 1 : len(ids) - 1]
        logits = h @ head.T
        if token_map is not None:
            full = logits.new_full((logits.shape[0], emb.shape[0]), float("-inf"))
            logits = full.index_copy_(-1, token_map, logits)
        q = warp(logits.float(), **WARP)
        qv = q.gather(-1, row["p_ids"])
        tot_a += torch.minimum(row["p"], qv).sum().item()
        tot_g += (logits.argmax(-1) == row["argmax"]).sum().item()
        n += logits.shape[0]
    student.train(was_training)
    return {"alpha": tot_a / n, "greedy_agreement": tot_g / n, "positions": int(n)}


def heldout_sets(cfg, target, tok, engine: str, work: Path, train_firsts: set[str], log) -> dict[str, dict]:
    """The held-out sets of ``cfg.heldout``, built once and cached in ``work``: ``eval`` (HumanEval + MT-Bench
    first turns: the shipped draft's held-out set) and, with ``n_chat``, ``chat`` (conversations of the chat
    mix's held-out split, none of whose first turns the training data has)."""
    h = cfg.heldout
    out = {}
    held_file = work / f"heldout-he{h.n_humaneval}-mt{h.n_mtbench}-n{h.max_new_tokens}-s{h.seed}.pt"
    if not held_file.exists():
        prompts = heldout_prompts(h.n_humaneval, h.n_mtbench, h.get("mt_bench_path"))
        save_atomic(
            build_heldout(target, tok, prompts, max_new_tokens=h.max_new_tokens, seed=h.seed, engine=engine), held_file
        )
    out["eval"] = torch.load(held_file)
    n_chat = h.get("n_chat", 0)
    if n_chat:
        chat_file = work / f"heldout-chat{n_chat}-n{h.max_new_tokens}-s{h.seed}-d{cfg.seed}.pt"
        if not chat_file.exists():
            convs = chat_heldout_conversations(n_chat, cfg.seed, train_firsts)
            save_atomic(
                build_heldout(target, tok, convs, max_new_tokens=h.max_new_tokens, seed=h.seed, engine=engine),
                chat_file,
            )
        out["chat"] = torch.load(chat_file)
    for name, held in out.items():
        log(
            f"held-out {name}: {len(held['prompts'])} prompts, {len(held['rows'])} answers, "
            f"{sum(len(r['p']) for r in held['rows'])} positions"
        )
    return out
