"""The distillation's training loop (``pipeline.training.distill``): the restricted head's token map, batches
of teacher records, the forward-KL loss against the teacher's top-k plus a rest-of-vocabulary bucket, and
the loop with its held-out alpha curve.
"""

from __future__ import annotations

import math
import random
import time

import torch
from tqdm import tqdm

from pipeline.training.distill_heldout import evaluate_alpha


def choose_token_map(records: list[dict], vocab_size: int, size: int, always: list[int]) -> torch.Tensor:
    """The ``size`` ids with the most teacher probability mass in the data (plus special ids), sorted."""
    mass = torch.zeros(vocab_size, dtype=torch.float64)
    for r in records:
        mass.index_add_(0, r["topk_ids"].reshape(-1).long(), r["topk_logp"].float().exp().reshape(-1).double())
        mass.index_add_(0, r["ids"].long(), torch.full((len(r["ids"]),), 1e-3, dtype=torch.float64))
    mass[torch.tensor(always, dtype=torch.long)] = float("inf")
    if size <= 0 or size >= vocab_size:
        return torch.arange(vocab_size)
    return mass.topk(size).indices.sort().values


def make_batches(records: list[dict], tokens_per_batch: int, max_len: int, seed: int) -> list[list[int]]:
    """Groups of record indices of similar length, about ``tokens_per_batch`` padded tokens each, shuffled."""
    rng = random.Random(seed)
    order = sorted(range(len(records)), key=lambda i: min(len(records[i]["ids"]), max_len) + rng.random())
    batches: list[list[int]] = []
    cur: list[int] = []
    width = 0
    for i in order:
        L = min(len(records[i]["ids"]), max_len)
        if cur and max(width, L) * (len(cur) + 1) > tokens_per_batch:
            batches.append(cur)
            cur, width = [], 0
        cur.append(i)
        width = max(width, L)
    if cur:
        batches.append(cur)
    rng.shuffle(batches)
    return batches


def collate(records: list[dict], idx: list[int], max_len: int, to_map: torch.Tensor, pad_id: int):
    """Right-padded inputs, the flat indices of answer positions, and the teacher rows in map indices."""
    b = len(idx)
    width = max(min(len(records[i]["ids"]), max_len) for i in idx)
    ids = torch.full((b, width), pad_id, dtype=torch.long)
    mask = torch.zeros((b, width), dtype=torch.long)
    flat_pos: list[torch.Tensor] = []
    t_id_rows: list[torch.Tensor] = []
    t_logp: list[torch.Tensor] = []
    for row, i in enumerate(idx):
        r = records[i]
        full, start = r["ids"].long(), r["start"]
        cut = max(0, len(full) - max_len)  # drop the oldest prompt tokens of over-long sequences
        seq = full[cut:]
        ids[row, : len(seq)] = seq
        mask[row, : len(seq)] = 1
        n_ans = len(full) - start
        first = start - 1 - cut  # position (in seq) predicting the first answer token
        keep = torch.arange(n_ans)[torch.arange(n_ans) + first >= 0]
        flat_pos.append(row * width + first + keep)
        t_id_rows.append(r["topk_ids"][keep].long())
        t_logp.append(r["topk_logp"][keep].float())
    t_ids = torch.cat(t_id_rows)
    return ids, mask, torch.cat(flat_pos), to_map[t_ids], torch.cat(t_logp)


def kd_loss(
    h: torch.Tensor,
    emb: torch.Tensor,
    token_map: torch.Tensor,
    neg_ids: torch.Tensor,
    t_map_idx: torch.Tensor,
    t_logp: torch.Tensor,
) -> torch.Tensor:
    """Forward KL(teacher || student) over the teacher's top-k (inside the map) plus one rest bucket.

    Student log-probs are over the map plus sampled negatives from outside it (their log-sum-exp scaled
    up to the size of the complement), so the restricted head is trained exactly and the full tied head
    learns to keep outside tokens low.
    """
    z = h @ emb[token_map].T  # [M, N]
    n_out = emb.shape[0] - token_map.numel()
    if n_out > 0 and neg_ids.numel():
        zn = h @ emb[neg_ids].T
        lse_out = torch.logsumexp(zn, -1) + math.log(n_out / neg_ids.numel())
        lse = torch.logaddexp(torch.logsumexp(z, -1), lse_out)
    else:
        lse = torch.logsumexp(z, -1)
    valid = t_map_idx >= 0
    zt = z.gather(-1, t_map_idx.clamp(min=0))
    logq = (zt - lse[:, None]).masked_fill(~valid, float("-inf"))
    p = t_logp.exp() * valid
    rest_p = (1 - p.sum(-1)).clamp(min=1e-6)
    q_top = logq.exp().sum(-1).clamp(max=1 - 1e-6)
    kl_top = (p * (t_logp - logq.masked_fill(~valid, 0.0))).sum(-1)
    kl_rest = rest_p * (rest_p.log() - torch.log1p(-q_top))
    return (kl_top + kl_rest).mean()


def train(
    student,
    records: list[dict],
    token_map: torch.Tensor,
    heldout: dict | None,
    *,
    steps: int,
    tokens_per_batch: int,
    max_len: int,
    lr: float,
    warmup: int,
    weight_decay: float,
    negatives: int,
    eval_every: int,
    seed: int,
    pad_id: int,
    log=print,
    progress: bool = True,
    extra_heldout: dict[str, dict] | None = None,
    tokens_before: int = 0,
) -> list[dict]:
    """Train ``student`` in place for ``steps`` optimizer steps; returns the eval curve (time, training
    tokens, alpha, ...). ``extra_heldout`` sets are measured beside ``heldout`` at every eval
    (``alpha_<name>``); ``tokens_before`` counts the answer tokens the student was trained on before
    this run (a continued training's curve starts there)."""
    torch.manual_seed(seed)
    vocab = student.get_input_embeddings().weight.shape[0]
    to_map = torch.full((vocab,), -1, dtype=torch.long)
    to_map[token_map] = torch.arange(token_map.numel())
    outside = torch.ones(vocab, dtype=torch.bool)
    outside[token_map] = False
    outside = outside.nonzero().squeeze(-1)
    decay: list[torch.nn.Parameter] = []
    no_decay: list[torch.nn.Parameter] = []
    for name, p in student.named_parameters():
        (no_decay if p.ndim < 2 or "embed" in name else decay).append(p)
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=lr,
        betas=(0.9, 0.98),
        eps=1e-8,
    )
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warmup) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(s, steps) / steps)))
    )
    gen = torch.Generator().manual_seed(seed)
    student.train()
    curve: list[dict] = []
    batches: list[list[int]] = []
    epoch, ema = 0, None
    train_time = 0.0
    seen_tokens = 0  # answer positions trained on (a record's rows count once per epoch)

    def do_eval(step):
        if heldout is None:
            return
        m = evaluate_alpha(student, heldout, token_map)
        for name, extra in (extra_heldout or {}).items():
            e = evaluate_alpha(student, extra, token_map)
            m.update({f"alpha_{name}": e["alpha"], f"greedy_agreement_{name}": e["greedy_agreement"]})
        curve.append(
            {"step": step, "train_s": round(train_time, 1), "tokens": tokens_before + seen_tokens, "loss": ema, **m}
        )
        log(
            f"eval step {step} train {train_time / 60:.1f} min tokens {tokens_before + seen_tokens} loss "
            f"{ema if ema is None else round(ema, 4)} alpha {m['alpha']:.4f} greedy {m['greedy_agreement']:.4f}"
            + "".join(f" alpha_{k} {m[f'alpha_{k}']:.4f}" for k in extra_heldout or {})
        )

    do_eval(0)
    bar = tqdm(range(steps), disable=not progress, mininterval=30, maxinterval=60)
    for step in bar:
        if not batches:
            batches = make_batches(records, tokens_per_batch, max_len, seed + epoch)
            epoch += 1
        ts = time.time()
        ids, mask, pos, t_idx, t_logp = collate(records, batches.pop(), max_len, to_map, pad_id)
        seen_tokens += int(pos.numel())
        h = student.model(input_ids=ids, attention_mask=mask).last_hidden_state
        h = h.reshape(-1, h.shape[-1])[pos]
        neg = (
            outside[torch.randint(len(outside), (negatives,), generator=gen)]
            if negatives and len(outside)
            else outside[:0]
        )
        loss = kd_loss(h, student.get_input_embeddings().weight, token_map, neg, t_idx, t_logp)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(student.parameters(), 1.0)
        opt.step()
        sched.step()
        train_time += time.time() - ts
        ema = loss.item() if ema is None else 0.98 * ema + 0.02 * loss.item()
        bar.set_postfix(loss=f"{ema:.3f}", epoch=epoch, refresh=False)
        if (step + 1) % eval_every == 0 or step + 1 == steps:
            do_eval(step + 1)
    student.eval()
    return curve
