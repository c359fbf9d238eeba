"""Train Medusa heads for a pair's target with its backbone frozen (Medusa-1).

    python -m pipeline.train_medusa pair=smollm2-offline            # -> models/smollm2-135m-medusa/

Data (``pipeline.training.teacher_data.feature_data``, offline, from nothing that is evaluated: no HumanEval, MT-Bench,
Spider or Spec-Bench prompt is ever used):

- Python standard-library source from the running interpreter, shown as chat answers to a
  "show me the code of <file>" request (teacher-forced text);
- the target's own sampled answers (T=1, top-k 10, top-p 0.9) to instruction prompts written
  there (self-distillation: the contexts the heads meet when decoding for this target).

Held-out text comes from other stdlib files and other prompts. The target's last hidden states
(the input of its LM head) are computed once; each head is ``ResBlock^L`` followed by the target's
own tied LM head (shared, frozen, never saved), trained with ``sum_i 0.8^(i-1) CE(head_i(h_t),
y_{t+i+1})`` over the full vocabulary. The output folder gets ``medusa_config.json`` (architecture,
data sizes, held-out top-1 accuracy of every head, the command) and ``medusa_heads.safetensors``.
"""

from __future__ import annotations

from typing import Any, cast

import torch
import torch.nn.functional as F

from pipeline.decoding.medusa_heads import MedusaHeads, save_medusa_heads
from pipeline.training.common import load_frozen_target, repo_path, scheduled_steps, start_run
from pipeline.training.feature_corpus import feature_data


def head_examples(ids: torch.Tensor, seq: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Labels ``[N, K + 1]``: column i is token t+i+1 (column 0: the LM head's next token; column i:
    Medusa head i), -100 past the end of the position's sequence."""
    n = ids.numel()
    labels = torch.full((n, num_heads + 1), -100, dtype=torch.long)
    for i in range(num_heads + 1):
        shift = i + 1
        if shift < n:
            same = seq[shift:] == seq[:-shift]
            labels[:-shift, i] = torch.where(same, ids[shift:], torch.full_like(ids[shift:], -100))
    return labels


@torch.no_grad()
def head_accuracy(
    heads: MedusaHeads, lm_head, hidden: torch.Tensor, labels: torch.Tensor, chunk: int = 512
) -> list[float]:
    """Top-1 accuracy of LM head (entry 0, next token) and every Medusa head on ``hidden``."""
    k = heads.num_heads
    correct = torch.zeros(k + 1)
    total = torch.zeros(k + 1)
    for s in range(0, hidden.shape[0], chunk):
        h = hidden[s : s + chunk]
        lab = labels[s : s + chunk]
        preds = [lm_head(h).argmax(-1)] + list(heads(h, lm_head).argmax(-1))
        for i, pred in enumerate(preds):
            y = lab[:, i]
            ok = y != -100
            correct[i] += (pred[ok] == y[ok]).sum()
            total[i] += ok.sum()
    return (correct / total.clamp_min(1)).tolist()


def train_heads(
    heads: MedusaHeads,
    lm_head,
    hidden: torch.Tensor,
    labels: torch.Tensor,
    *,
    steps: int,
    batch_tokens: int,
    lr: float,
    warmup: int = 20,
    weight_decay: float = 0.0,
    decay: float = 0.8,
    vocab: torch.Tensor | None = None,
    seed: int = 0,
    deadline: float | None = None,
    log=print,
    log_every: int = 10,
    eval_every: int = 0,
    evaluate=None,
) -> None:
    """Medusa-1 training of ``heads`` on frozen ``hidden [N, H]`` with ``labels [N, K + 1]`` (head_examples).

    Loss ``sum_i decay^(i-1) CE(head_i, y_{t+i+1})``; AdamW, linear warm-up, cosine decay. With ``vocab``
    (token ids containing every label), the softmax runs over those tokens only (much cheaper on a CPU).
    """
    k = heads.num_heads
    opt = torch.optim.AdamW(heads.parameters(), lr=lr, weight_decay=weight_decay)
    weights = [decay**i for i in range(k)]
    if vocab is not None:
        W = lm_head.weight[vocab].detach()
        remap = torch.full((lm_head.weight.shape[0],), -100, dtype=torch.long)
        remap[vocab] = torch.arange(vocab.numel())
        y_fit = torch.where(labels >= 0, remap[labels.clamp_min(0)], labels)
    else:
        W, y_fit = lm_head.weight.detach(), labels
    # the heads train in their own dtype (float32) whatever the target's (bf16 where the CPU kernels run)
    dtype = next(heads.parameters()).dtype
    W = W.to(dtype)
    gen = torch.Generator().manual_seed(seed)
    n = hidden.shape[0]
    heads.train()
    for step, rate in scheduled_steps(opt, lr=lr, warmup=warmup, steps=steps, deadline=deadline, log=log):
        idx = torch.randint(0, n, (batch_tokens,), generator=gen)
        logits = heads.features(hidden[idx].to(dtype)) @ W.T  # [K, B, V']
        y = y_fit[idx]
        # a tensor: k >= 1 heads
        loss = cast(
            torch.Tensor, sum(weights[i] * F.cross_entropy(logits[i], y[:, i + 1], ignore_index=-100) for i in range(k))
        )
        opt.zero_grad()
        loss.backward()
        opt.step()
        if log_every and (step % log_every == 0 or step == 1):
            log(f"step {step}/{steps} loss {float(loss.detach()):.4f} lr {rate:.2e}")
        if eval_every and evaluate is not None and step % eval_every == 0:
            heads.eval()
            evaluate(step)
            heads.train()
    heads.eval()


def run(cfg: dict[str, Any]) -> dict[str, Any]:
    job = start_run(threads=cfg["threads"], seed=cfg["seed"], work_dir=cfg["work_dir"])
    log, t0 = job.log, job.t0
    spec, model, tokenizer = load_frozen_target(cfg["pair"])
    lm_head = model.get_output_embeddings()

    data = feature_data(model, tokenizer, cfg["data"], cfg["seed"], job.work / "data.pt", log)

    k = cfg["heads"]["num_heads"]
    heads = MedusaHeads(model.config.hidden_size, k, cfg["heads"]["num_layers"])
    h_train, ids_train, seq_train = data["train"]
    y_train = head_examples(ids_train, seq_train, k)
    held = {
        tag: (data[tag][0], head_examples(data[tag][1], data[tag][2], k))
        for tag in ("heldout_stdlib", "heldout_answers")
    }

    tc = cfg["train"]
    vocab = None
    if tc["vocab"] == "corpus":
        vocab = torch.unique(torch.cat([ids_train] + [data[t][1] for t in held]))
        log(f"training softmax over {vocab.numel()} corpus tokens")

    def evaluate(step: int) -> None:
        for tag, (h, lab) in held.items():
            log(
                f"step {step} held-out top-1 [{tag}] "
                + " ".join(f"{a:.3f}" for a in head_accuracy(heads, lm_head, h, lab))
            )

    train_heads(
        heads,
        lm_head,
        h_train,
        y_train,
        steps=tc["steps"],
        batch_tokens=tc["batch_tokens"],
        lr=tc["lr"],
        warmup=tc["warmup"],
        weight_decay=tc["weight_decay"],
        decay=tc["decay"],
        vocab=vocab,
        seed=cfg["seed"],
        deadline=t0 + tc["time_budget_s"],
        log=log,
        log_every=tc["log_every"],
        eval_every=tc["eval_every"],
        evaluate=evaluate,
    )
    n = h_train.shape[0]

    accuracy = {}
    for tag, (h, lab) in held.items():
        acc = head_accuracy(heads, lm_head, h, lab)
        accuracy[tag] = {"lm_head": round(acc[0], 4), **{f"head_{i}": round(a, 4) for i, a in enumerate(acc[1:], 1)}}
        log(f"final held-out top-1 [{tag}] ({h.shape[0]} tokens): {accuracy[tag]}")
    out_dir = repo_path(cfg["out_dir"])
    info = {
        "base_model": spec.target.id,
        "base_gguf_file": spec.target.gguf_file,
        "lm_head": "shared with the target (tied embedding), not stored",
        "heldout_top1": accuracy,
        "train_tokens": int(n),
        "heldout_tokens": {tag: int(h.shape[0]) for tag, (h, _) in held.items()},
        "train": {key: tc[key] for key in ("steps", "batch_tokens", "lr", "decay")},
        "seed": cfg["seed"],
        "command": cfg.get("command", "python -m pipeline.train_medusa"),
        "minutes": job.minutes(),
    }
    save_medusa_heads(heads, out_dir, **info)
    log(f"saved heads to {out_dir}")
    return info
