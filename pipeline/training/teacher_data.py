"""Teacher data for draft distillation: offline prompts, the target's own sampled answers, top-k log-probs.

Everything here is built on this machine from the project's own templates and the Python standard
library's source, so no evaluation prompt (HumanEval, MT-Bench, Spider, Spec-Bench, CNN/DM) can leak
into training. Two kinds of records are produced, both in the chat format of the target:

- ``gen``: an instruction prompt and the target's *sampled* answer (on-policy: the contexts a draft
  meets when it drafts for this target), with the teacher's top-k log-probabilities at every answer
  position, recorded while sampling (no second pass);
- ``tf``: a standard-library function shown as an assistant answer and scored by one teacher-forced
  target pass (cheaper per token than sampling: one parallel forward instead of one step per token).

The prompts themselves (templates, word lists, standard-library functions) are
``pipeline.training.prompt_sets``. Shards are written as they are produced (``.cache/distill/<name>/shard-XXXX.pt``) so
that a run can be stopped at any time and training can use what exists.

The heads (Medusa, EAGLE) learn from a second offline corpus, the *feature corpus* (``feature_data``):
standard-library source shown as chat answers and the target's own sampled answers to the prompts of
``FEATURE_TOPICS`` / ``FEATURE_CODE_TASKS``, with the frozen target's last hidden states over it. Its
prompts and its sampler (transformers' ``generate`` under the global seed) stay as they were when the
shipped heads were trained, so that a run with the same seed rebuilds the same data.
"""

from __future__ import annotations

import inspect
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, cast

import torch
from transformers import DynamicCache

from pipeline.decoding.kv import CachedModel
from pipeline.decoding.warping import Warper, warp
from pipeline.prompts import chat_ids, encode_prompt
from pipeline.training.chat_mix import Conversation, chat_conversations
from pipeline.training.contamination import refuse_evaluation_prompts
from pipeline.training.prompt_sets import build_prompts, stdlib_functions
from pipeline.training.shards import SHARD_FORMATS, ShardFolder

# generate_teacher_data's arguments that are not settings, and the settings that do not change a shard's content
# (a run resumes with other ones)
NOT_SETTINGS = ("target", "tokenizer", "out_dir", "identity", "info", "on_shard", "log")
RUN_ONLY = ("time_budget_s", "max_shards", "stop_before_budget")

# --------------------------------------------------------------------------------------------------
# Teacher passes
# --------------------------------------------------------------------------------------------------


@dataclass
class Record:
    """One training sequence: ``ids`` (prompt + answer), answer start, teacher top-k at answer positions.

    ``topk_ids[j]`` / ``topk_logp[j]`` describe the teacher's next-token distribution at position
    ``start - 1 + j`` (predicting ``ids[start + j]``).
    """

    ids: torch.Tensor  # int32 [L]
    start: int
    topk_ids: torch.Tensor  # int32 [L - start, K]
    topk_logp: torch.Tensor  # float16 [L - start, K]
    kind: str


def padding_id(tokenizer) -> int:
    """The id that pads a batch: the tokenizer's pad token, else its EOS."""
    return tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id


def left_pad(prompt_ids: list[list[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A left-padded batch of prompts (so that every row's next token is at the end): ids and attention mask."""
    width = max(len(p) for p in prompt_ids)
    ids = torch.full((len(prompt_ids), width), pad, dtype=torch.long)
    mask = torch.zeros((len(prompt_ids), width), dtype=torch.long)
    for i, p in enumerate(prompt_ids):
        ids[i, width - len(p) :] = torch.tensor(p, dtype=torch.long)
        mask[i, width - len(p) :] = 1
    return ids, mask


def _warped_sample(logits: torch.Tensor, top_k: int, top_p: float, gen: torch.Generator) -> torch.Tensor:
    """One draw per row of ``logits [B, V]`` from the warped row (T=1): from its k kept entries alone
    when top-k is on (a multinomial over a full 49k-vocabulary row costs ~1 ms a row on a CPU)."""
    if top_k <= 0:
        return torch.multinomial(warp(logits, 1.0, top_k, top_p), 1, generator=gen).squeeze(-1)
    index, probs = Warper(1.0, top_k, top_p).top_k_rows(logits)
    return index.gather(-1, torch.multinomial(probs, 1, generator=gen)).squeeze(-1)


@torch.no_grad()
def sample_answers(
    target,
    prompt_ids: list[list[int]],
    *,
    max_new_tokens: int,
    top_k_store: int,
    sample_top_k: int,
    sample_top_p: float,
    eos_id: int,
    pad_id: int,
    gen: torch.Generator,
) -> list[Record]:
    """Sample one answer per prompt in one left-padded batch; record the teacher's top-k at each step.

    Finished rows are dropped from the batch (and the KV cache) so no step is spent on them.
    """
    b = len(prompt_ids)
    device = next(target.parameters()).device
    ids, mask = (t.to(device) for t in left_pad(prompt_ids, pad_id))
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    cache = DynamicCache()
    logits = target(input_ids=ids, attention_mask=mask, position_ids=pos, past_key_values=cache, use_cache=True).logits[
        :, -1
    ]
    alive = torch.arange(b, device=device)
    next_pos = pos[:, -1] + 1
    answers: list[list[int]] = [[] for _ in range(b)]
    tk_ids: list[list[torch.Tensor]] = [[] for _ in range(b)]
    tk_lp: list[list[torch.Tensor]] = [[] for _ in range(b)]
    for step in range(max_new_tokens):
        logp = logits.float().log_softmax(-1)
        vals, idx = logp.topk(top_k_store, dim=-1)
        tok = _warped_sample(logits, sample_top_k, sample_top_p, gen)
        # one copy to the host per step (on a GPU, a per-row read would wait for the device once a row)
        tok_host, idx_host, vals_host = tok.tolist(), idx.to(torch.int32).cpu(), vals.to(torch.float16).cpu()
        keep = []
        for r, row in enumerate(alive.tolist()):
            answers[row].append(tok_host[r])
            tk_ids[row].append(idx_host[r])
            tk_lp[row].append(vals_host[r])
            if tok_host[r] != eos_id:
                keep.append(r)
        if not keep or step == max_new_tokens - 1:
            break
        if len(keep) < len(alive):
            sel = torch.tensor(keep, device=device)
            cache.batch_select_indices(sel)
            alive, mask, next_pos, tok = alive[sel], mask[sel], next_pos[sel], tok[sel]
        mask = torch.cat([mask, torch.ones((len(alive), 1), dtype=torch.long, device=device)], dim=1)
        logits = target(
            input_ids=tok[:, None],
            attention_mask=mask,
            position_ids=next_pos[:, None],
            past_key_values=cache,
            use_cache=True,
        ).logits[:, -1]
        next_pos = next_pos + 1
    out = []
    for i, p in enumerate(prompt_ids):
        full = torch.tensor(p + answers[i], dtype=torch.int32)
        out.append(Record(full, len(p), torch.stack(tk_ids[i]), torch.stack(tk_lp[i]), "gen"))
    return out


@torch.no_grad()
def sample_answers_packed(
    cached,
    prompt_ids: list[list[int]],
    *,
    max_new_tokens: int,
    top_k_store: int,
    sample_top_k: int,
    sample_top_p: float,
    eos_id: int,
    gen: torch.Generator,
    slots: int = 48,
    max_cache: int = 16384,
) -> list[Record]:
    """``sample_answers`` on the engine's batch-1 forward (``CachedModel``, e.g. the bf16 CPU kernels):
    up to ``slots`` independent sequences share one KV cache, each row of a step seeing only its own
    sequence's slots (``CachedModel.forward_masked``), and a finished sequence's slot takes the next
    prompt at once (continuous batching). A step of ``slots`` rows streams the weights once, so on a
    CPU this yields many times the tokens/s of one sequence at a time or of transformers' padded batches.

    Every sampled answer is an exact draw from the warped target (the rows are the model's rows for
    that sequence alone); draws come from ``gen`` in a fixed order, so a run is deterministic.
    The cache is compacted to the live sequences' slots when it would exceed ``max_cache``.
    """
    n = len(prompt_ids)
    cached.reset()
    device = cached.device
    owner = torch.empty(0, dtype=torch.long, device=device)  # the sequence of every cached slot
    answers: list[list[int]] = [[] for _ in range(n)]
    tk_ids: list[list[torch.Tensor]] = [[] for _ in range(n)]
    tk_lp: list[list[torch.Tensor]] = [[] for _ in range(n)]
    next_pos = [len(p) for p in prompt_ids]
    queue = list(range(n))[::-1]
    feeding: list[int] = []  # sequences whose last sampled token is still to be fed
    while queue or feeding:
        rows, seqs = [], []
        if feeding:  # one step of every live sequence
            live = torch.tensor(feeding, device=device)
            start = cached.length
            if start + len(feeding) > max_cache:
                keep = torch.isin(owner, live).nonzero().squeeze(-1)
                cached.compact(0, keep)
                owner, start = owner[keep], int(keep.numel())
            allowed = torch.cat(
                [owner[None, :] == live[:, None], torch.eye(len(feeding), dtype=torch.bool, device=device)], 1
            )
            tokens = torch.tensor([answers[s][-1] for s in feeding])
            positions = torch.tensor([next_pos[s] for s in feeding])
            rows.append(cached.forward_masked(tokens, positions, allowed))
            owner = torch.cat([owner, live])
            for s in feeding:
                next_pos[s] += 1
            seqs += feeding
        while queue and len(seqs) < slots:  # new prompts into free slots: their last row gives the first token
            s = queue.pop()
            ids = torch.tensor(prompt_ids[s])
            m, start = len(ids), cached.length
            allowed = torch.zeros(m, start + m, dtype=torch.bool, device=device)
            allowed[:, start:] = torch.ones(m, m, dtype=torch.bool, device=device).tril()
            rows.append(cached.forward_masked(ids, torch.arange(m), allowed, keep=1))
            owner = torch.cat([owner, torch.full((m,), s, device=device)])
            seqs.append(s)
        logits = torch.cat(rows).float()
        vals, idx = logits.log_softmax(-1).topk(top_k_store, dim=-1)
        tok = _warped_sample(logits, sample_top_k, sample_top_p, gen).tolist()
        feeding = []
        for r, s in enumerate(seqs):
            answers[s].append(tok[r])
            tk_ids[s].append(idx[r].to(torch.int32))
            tk_lp[s].append(vals[r].to(torch.float16))
            if tok[r] != eos_id and len(answers[s]) < max_new_tokens:
                feeding.append(s)
    out = []
    for i, p in enumerate(prompt_ids):
        full = torch.tensor(p + answers[i], dtype=torch.int32)
        out.append(Record(full, len(p), torch.stack(tk_ids[i]).cpu(), torch.stack(tk_lp[i]).cpu(), "gen"))
    return out


def conversation_ids(tokenizer, conv: Conversation, answers: list[list[int]]) -> list[int]:
    """The chat-template ids of ``conv``'s next user turn, after its earlier turns and the target's own
    ``answers`` to them (their ids decoded to text, EOS dropped: what a chat front end sends back)."""
    messages = []
    for user, answer in zip(conv.turns, answers):
        text = tokenizer.decode([t for t in answer if t != tokenizer.eos_token_id], skip_special_tokens=True)
        messages += [{"role": "user", "content": user}, {"role": "assistant", "content": text}]
    messages.append({"role": "user", "content": conv.turns[len(answers)]})
    return encode_prompt(tokenizer, messages, chat=True)


def sample_conversations(
    tokenizer, convs: list[Conversation], sample: Callable[[list[list[int]]], list[Record]], max_prompt: int = 1536
) -> list[Record]:
    """The target's answers to every turn of ``convs``: one ``sample`` call per turn depth (all first turns
    packed together, then all second turns, each after its conversation's own sampled first answer).
    First answers are ``gen`` records, later ones ``gen2``; a later turn whose prompt would pass
    ``max_prompt`` tokens is left out (its conversation keeps its earlier records)."""
    answers: list[list[list[int]]] = [[] for _ in convs]
    out: list[Record] = []
    depth = 0
    while True:
        todo = [i for i, c in enumerate(convs) if len(c.turns) > depth]
        ids = [conversation_ids(tokenizer, convs[i], answers[i]) for i in todo]
        keep = [k for k, x in enumerate(ids) if depth == 0 or len(x) <= max_prompt]
        todo, ids = [todo[k] for k in keep], [ids[k] for k in keep]
        if not todo:
            return out
        for i, rec in zip(todo, sample(ids)):
            answers[i].append(rec.ids[rec.start :].tolist())
            rec.kind = "gen" if depth == 0 else "gen2"
            out.append(rec)
        depth += 1


def chat_heldout_conversations(n: int, seed: int, train_firsts: set[str]) -> list[Conversation]:
    """``n`` conversations of the chat mix's held-out split whose first turn no training conversation has."""
    k = n
    while True:
        held = [c for c in chat_conversations(k, seed, "heldout") if c.turns[0] not in train_firsts]
        if len(held) >= n or k > 64 * n:
            return held[:n]
        k *= 2


@torch.no_grad()
def teacher_force_cached(cached, seqs: list[tuple[list[int], int]], *, top_k_store: int) -> list[Record]:
    """``teacher_force`` on the engine's forward: one sequence at a time (no padding), all rows' logits."""
    out = []
    for s, start in seqs:
        cached.reset()
        logp = cached.forward(s, keep=0)[start - 1 : len(s) - 1].log_softmax(-1)
        vals, idx = logp.topk(top_k_store, dim=-1)
        out.append(
            Record(
                torch.tensor(s, dtype=torch.int32), start, idx.to(torch.int32).cpu(), vals.to(torch.float16).cpu(), "tf"
            )
        )
    return out


@torch.no_grad()
def teacher_force(target, seqs: list[tuple[list[int], int]], *, top_k_store: int, pad_id: int) -> list[Record]:
    """Teacher top-k at the answer positions of complete sequences (right-padded batch, one pass)."""
    b = len(seqs)
    width = max(len(s) for s, _ in seqs)
    ids = torch.full((b, width), pad_id, dtype=torch.long)
    mask = torch.zeros((b, width), dtype=torch.long)
    for i, (s, _) in enumerate(seqs):
        ids[i, : len(s)] = torch.tensor(s)
        mask[i, : len(s)] = 1
    device = next(target.parameters()).device
    hidden = target.model(input_ids=ids.to(device), attention_mask=mask.to(device)).last_hidden_state
    out = []
    for i, (s, start) in enumerate(seqs):
        h = hidden[i, start - 1 : len(s) - 1]
        logp = target.lm_head(h).float().log_softmax(-1)
        vals, idx = logp.topk(top_k_store, dim=-1)
        out.append(
            Record(
                torch.tensor(s, dtype=torch.int32), start, idx.to(torch.int32).cpu(), vals.to(torch.float16).cpu(), "tf"
            )
        )
    return out


def build_tf_sequences(tokenizer, n: int, seed: int, max_len: int) -> list[tuple[list[int], int]]:
    """Chat-formatted stdlib functions: the user asks for a function, the answer is its real source."""
    rng = random.Random(seed + 1)
    funcs = list(stdlib_functions())  # a copy: the parsed functions are cached
    rng.shuffle(funcs)
    seqs = []
    for module, name, header, source in funcs[:n]:
        first = header.strip().splitlines()[0]
        user = rng.choice(
            [
                f"Write a Python function `{name}` like the one in the `{module}` module.",
                f"Implement this function:\n{first}",
                f"Show me how `{module}.{name}` could be implemented in Python.",
            ]
        )
        answer = rng.choice(["", "Here is an implementation:\n\n", "Sure! "]) + f"```python\n{source}\n```"
        start = len(chat_ids(tokenizer, user))
        ids = chat_ids(tokenizer, user, answer)[:max_len]
        if len(ids) - start >= 16:
            seqs.append((ids, start))
    return seqs


def first_turn_ids(tokenizer, item: Conversation | str) -> list[int]:
    """The chat-template ids of a prompt, or of a conversation's first user turn."""
    return conversation_ids(tokenizer, item, []) if isinstance(item, Conversation) else chat_ids(tokenizer, item)


FORECAST_MARGIN = 1.25


def forecast_seconds(sampler, teacher_forced, batch: list, use_tf: bool, max_new_tokens: int, first_ids) -> float:
    """The seconds a shard of ``batch`` should take, estimated before any shard has run (``FORECAST_MARGIN`` over):
    sampled shards time one warm-up row, then the whole batch's first turn at 1 and at 3 new tokens (its prefill
    and a step: every row is counted for ``max_new_tokens`` steps of each turn, though finished rows leave the
    batch, and a later turn's prefill, whose prompt holds the earlier turns, at twice the first's); teacher-forced
    ones time one sequence and count it once a sequence. An estimate: the longest measured shard replaces it."""
    if use_tf:
        t = time.time()
        teacher_forced(batch[:1])
        return FORECAST_MARGIN * (time.time() - t) * len(batch)
    ids = [first_ids(p) for p in batch]
    turns = max(len(p.turns) if isinstance(p, Conversation) else 1 for p in batch)
    sampler(1)(ids[:1])
    t = time.time()
    sampler(1)(ids)
    one = time.time() - t
    t = time.time()
    sampler(3)(ids)
    step = max(time.time() - t - one, 0.0) / 2
    return FORECAST_MARGIN * (one * (2 * turns - 1) + turns * (max_new_tokens - 1) * step)


def generate_teacher_data(
    target,
    tokenizer,
    out_dir: Path,
    *,
    n_prompts: int,
    tf_fraction: float,
    batch_size: int,
    max_new_tokens: int,
    top_k_store: int,
    sample_top_k: int,
    sample_top_p: float,
    seed: int,
    time_budget_s: float,
    max_shards: int | None = None,
    max_tf_len: int = 320,
    engine: str = "batched",
    slots: int = 64,
    prompts: str = "instructions",
    multi_turn: float = 0.4,
    shard_format: str = "pt",
    stop_before_budget: bool = False,
    identity: Mapping[str, Any] | None = None,
    info: Mapping[str, Any] | None = None,
    on_shard: Callable[[Path], None] | None = None,
    log=print,
) -> None:
    """Write teacher shards to ``out_dir`` until ``n_prompts`` are done or the time budget is spent.

    ``max_shards`` stops after that many shards (reproducing a run cut by its budget). Shards alternate between
    sampled answers (``gen``) and teacher-forced stdlib sources (``tf``), ``tf_fraction`` of shards.

    ``engine``: ``batched`` runs transformers' forward on left-padded batches (``sample_answers``; right
    on a GPU); ``packed`` runs the engine's batch-1 forward with up to ``slots`` sequences packed into one
    KV cache (``sample_answers_packed``, ``teacher_force_cached``; right on a CPU with the bf16 kernels).

    ``prompts``: ``instructions`` (``prompt_sets.build_prompts``: the shipped draft's data) or ``chat``
    (``chat_mix.chat_conversations``' train split: a broad chat mix, ``multi_turn`` of it with a second
    user turn answered after the target's own first answer). Either is checked against the evaluation
    sets first (``contamination.refuse_evaluation_prompts``).

    ``shard_format``: ``pt`` (``torch.save`` of the records) or ``npz`` (``save_shard``'s compact arrays: what a GPU
    node's run brings back, jobs/gpu_teacher.sh). Samples draw from a generator on the target's device.
    ``stop_before_budget``: a shard that would end past the time budget is not begun, so the run ends within the
    budget (a device call's bound): the forecast is the longest shard so far (this call's or the manifest's) with
    ``FORECAST_MARGIN``, and before the first one ``forecast_seconds``' probe; otherwise the shard that passes the
    budget is the last.

    ``out_dir``'s manifest (``shards.ShardFolder``) records the settings (these keywords but the budget's, the
    target's vocabulary and dtype, and ``identity``) and every finished shard (size, SHA-256, seconds); a run
    resumes there only with the same settings, and regenerates a shard whose file does not match its entry. Each
    shard and then the manifest are written atomically, ``info`` beside them, then ``on_shard(path)`` is called
    (a GPU node bundles it at once: a later kill loses only the shard in progress).
    """
    locals_settings = {k: v for k, v in locals().items() if k not in NOT_SETTINGS}
    if engine not in ("batched", "packed"):
        raise ValueError(f"data.engine must be batched or packed, not {engine!r}")
    if shard_format not in SHARD_FORMATS:
        raise ValueError(f"shard_format must be one of {SHARD_FORMATS}, not {shard_format!r}")
    device = next(target.parameters()).device
    cached = CachedModel(target) if engine == "packed" else None
    if prompts == "instructions":
        items: list = build_prompts(n_prompts, seed)
        refuse_evaluation_prompts(items)
    elif prompts == "chat":
        items = chat_conversations(n_prompts, seed, "train", multi_turn)
        refuse_evaluation_prompts(t for c in items for t in c.turns)
    else:
        raise ValueError(f"data.prompts must be instructions or chat, not {prompts!r}")
    first = [c.turns[0] if isinstance(c, Conversation) else c for c in items]
    # Left padding wastes prefill work on short prompts: sort by length inside blocks of 8 batches
    # (blocks keep every kind of prompt spread over the whole run).
    block = 8 * batch_size
    lengths = [len(chat_ids(tokenizer, p)) for p in first]
    order = [
        i
        for b in range(0, len(items), block)
        for i in sorted(range(b, min(b + block, len(items))), key=lengths.__getitem__)
    ]
    items = [items[i] for i in order]
    n_tf = int(round(n_prompts * tf_fraction))
    tf_seqs = build_tf_sequences(tokenizer, n_tf, seed, max_tf_len)
    pad = padding_id(tokenizer)
    folder = ShardFolder(
        out_dir,
        {
            **{k: v for k, v in locals_settings.items() if k not in RUN_ONLY},
            "vocab_size": int(target.config.vocab_size),
            "dtype": str(target.dtype).removeprefix("torch."),
            **(identity or {}),
        },
        log,
    )

    def sampler(new_tokens: int, gen: torch.Generator) -> Callable[[list[list[int]]], list[Record]]:
        kw: dict[str, Any] = dict(
            max_new_tokens=new_tokens, top_k_store=top_k_store, sample_top_k=sample_top_k, gen=gen
        )
        kw.update(sample_top_p=sample_top_p, eos_id=tokenizer.eos_token_id)
        if cached is not None:
            return lambda ids: sample_answers_packed(cached, ids, slots=slots, **kw)
        return lambda ids: sample_answers(target, ids, pad_id=pad, **kw)

    def teacher_forced(batch: list[tuple[list[int], int]]) -> list[Record]:
        if cached is not None:
            return teacher_force_cached(cached, batch, top_k_store=top_k_store)
        return teacher_force(target, batch, top_k_store=top_k_store, pad_id=pad)

    t0 = time.time()
    shard, pi, ti, total, forecast = 0, 0, 0, 0, FORECAST_MARGIN * folder.longest()
    every_tf = max(1, round(1 / tf_fraction) - 1) if tf_fraction > 0 else 0
    while (pi < len(items) or ti < len(tf_seqs)) and (max_shards is None or shard < max_shards):
        use_tf = tf_fraction > 0 and ti < len(tf_seqs) and (pi >= len(items) or (shard % (every_tf + 1) == every_tf))
        name = f"shard-{shard:04d}.{shard_format}"
        if use_tf:
            batch = tf_seqs[ti : ti + max(1, batch_size // 2)]
            ti += len(batch)
        else:
            batch = items[pi : pi + batch_size]
            pi += len(batch)
        if folder.done(name):  # resume: the generator state is re-derived from the shard's index
            shard += 1
            continue
        if stop_before_budget and not forecast:  # no shard timed yet: the probe's estimate
            probe = lambda n: sampler(n, torch.Generator(device=device).manual_seed(0))  # noqa: E731
            forecast = forecast_seconds(
                probe, teacher_forced, batch, use_tf, max_new_tokens, lambda p: first_turn_ids(tokenizer, p)
            )
            log(f"forecast: {forecast:.3g}s a shard (a probe of shard {shard}'s batch)")
        if stop_before_budget and time.time() - t0 + forecast > time_budget_s:
            log(f"time budget: shard {shard} would end past {time_budget_s:.0f}s (forecast {forecast:.3g}s)")
            break
        ts = time.time()
        if use_tf:
            recs = teacher_forced(batch)
        else:
            sample = sampler(max_new_tokens, torch.Generator(device=device).manual_seed(seed * 100003 + shard))
            if prompts == "chat":
                recs = sample_conversations(tokenizer, cast(list[Conversation], batch), sample)
            else:
                recs = sample([chat_ids(tokenizer, p) for p in cast(list[str], batch)])
        path = folder.add(name, recs, time.time() - ts, time.time() - t0, info or {})
        if on_shard is not None:
            on_shard(path)
        ntok = sum(len(r.topk_ids) for r in recs)
        total += ntok
        el = time.time() - t0
        forecast = FORECAST_MARGIN * folder.longest()
        log(
            f"shard {shard} {'tf ' if use_tf else 'gen'} records {len(recs)} tokens {ntok} total {total} "
            f"elapsed {el:.0f}s rate {total / max(el, 1e-9):.1f} tok/s"
        )
        shard += 1
        if el > time_budget_s:
            log(f"time budget reached after {el:.0f}s")
            break


NOT_GENERATION = ("teacher_dir",)  # keys of conf/distill.yaml's data: that are not generation settings


def teacher_settings(data: Mapping[str, Any], **overrides: Any) -> dict[str, Any]:
    """``generate_teacher_data``'s keywords from a ``data:`` section of conf/distill.yaml (its keys are the keywords'
    names; ``NOT_GENERATION`` keys are left out), ``overrides`` winning: how the distillation and a GPU node's run
    (``gpu_teacher``, which records them in its manifest) make one generation. A key the generation does not take is
    a ValueError naming the ones it takes."""
    taken = [k for k in inspect.signature(generate_teacher_data).parameters if k not in NOT_SETTINGS]
    settings = {k: v for k, v in {**data, **overrides}.items() if k not in NOT_GENERATION}
    unknown = sorted(set(settings) - set(taken))
    if unknown:
        raise ValueError(
            f"data: unknown teacher-data setting(s) {unknown}; the generation takes {taken} (conf/distill.yaml)"
        )
    return settings
