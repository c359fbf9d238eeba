"""Train an EAGLE-1/2 head for a pair's target with the target frozen (CLI: ``pipeline.train_eagle``).

Data: the offline feature corpus of ``pipeline.training.teacher_data.feature_data`` (standard-library source shown
as chat answers + the target's own sampled answers to instruction prompts written there; no
evaluation prompt is ever used), with the frozen target's last hidden states (post final norm, the
LM head's input). Held-out text: other stdlib files and other prompts.

Teacher forcing over windows of each sequence: row t of the head sees (f_t, x_{t+1}) and predicts
f_{t+1}. Loss (EAGLE paper): ``smooth_l1(f_hat, f) + w_kl * CE(softmax(lm(f)), log_softmax(lm(f_hat)))``
over the head's vocabulary (restricted map, or full). Input features get uniform noise (EAGLE's
data augmentation). AdamW, warm-up + cosine, deterministic from the seed (one torch thread).

Held-out alpha, logged every ``eval_every`` steps: the expected acceptance ``sum_x min(p(x), q(x))``
of the head's first draft token against the target's next-token row, both warped as sampled
decoding warps them (T = 1, top-k 10, top-p 0.9), teacher-forced over the held-out text.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from pipeline.decoding.eagle import EagleHead, eagle_config, save_eagle_head
from pipeline.decoding.warping import Warper
from pipeline.training.common import load_frozen_target, repo_path, start_run, train_head
from pipeline.training.feature_corpus import feature_data


def split_sequences(
    hidden: torch.Tensor, ids: torch.Tensor, seq: torch.Tensor
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per-sequence (features [L, H], token ids [L]) from ``feature_data``'s concatenation."""
    out = []
    for s in torch.unique_consecutive(seq):
        sel = seq == s
        out.append((hidden[sel], ids[sel]))
    return [o for o in out if o[1].numel() >= 3]


def windows(seqs, length: int) -> list[tuple[int, int]]:
    """(sequence index, start) of non-overlapping windows of up to ``length + 1`` tokens."""
    out = []
    for i, (_, ids) in enumerate(seqs):
        for start in range(0, ids.numel() - 2, length):
            out.append((i, start))
    return out


def window_batch(seqs, picks, length: int, embed, noise: float, gen: torch.Generator | None):
    """Padded batch: features f_t, embeddings of x_{t+1}, targets f_{t+1}, mask, and positions."""
    feats, embs, tgts, masks = [], [], [], []
    for i, start in picks:
        f, x = seqs[i]
        end = min(start + length, f.shape[0] - 1)
        n = end - start
        pad = length - n
        fi = f[start:end]
        if noise and gen is not None:
            fi = fi + (torch.rand(fi.shape, generator=gen) * 2 - 1) * noise
        feats.append(F.pad(fi, (0, 0, 0, pad)))
        embs.append(F.pad(embed(x[start + 1 : end + 1]), (0, 0, 0, pad)))
        tgts.append(F.pad(f[start + 1 : end + 1], (0, 0, 0, pad)))
        masks.append(torch.arange(length) < n)
    positions = torch.arange(length)[None].expand(len(picks), length)
    return torch.stack(feats), torch.stack(embs), torch.stack(tgts), torch.stack(masks), positions


@torch.no_grad()
def heldout_alpha(
    head: EagleHead, seqs, W: torch.Tensor, length: int, embed, warper: Warper, batch: int = 8
) -> dict[str, float]:
    """Teacher-forced first-token acceptance (warped) and top-1 agreement of the head on held-out sequences."""
    head.eval()
    picks = windows(seqs, length)
    acc_sum, top1, total = 0.0, 0.0, 0
    for b in range(0, len(picks), batch):
        f, e, tgt, mask, pos = window_batch(seqs, picks[b : b + batch], length, embed, 0.0, None)
        pred = head(f, e, pos)
        P = warper(tgt[mask] @ W.T)
        Q = warper(pred[mask] @ W.T)
        acc_sum += float(torch.minimum(P, Q).sum(-1).sum())
        top1 += float((P.argmax(-1) == Q.argmax(-1)).sum())
        total += int(mask.sum())
    return {"alpha": acc_sum / max(total, 1), "top1": top1 / max(total, 1), "tokens": total}


def train_eagle(
    head: EagleHead,
    seqs,
    W: torch.Tensor,
    embed,
    *,
    steps: int,
    batch: int,
    length: int,
    lr: float,
    warmup: int,
    weight_decay: float,
    kl_weight: float,
    noise: float,
    seed: int,
    stop_after: int | None = None,
    deadline: float | None = None,
    log=print,
    log_every: int = 10,
    eval_every: int = 0,
    evaluate=None,
) -> int:
    """Teacher-forced EAGLE training on frozen features; returns the number of steps run.

    ``stop_after``: stop after that many steps without changing the schedule (deterministic, unlike
    ``deadline``, the wall-clock safety net)."""
    params = [p for p in head.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)
    gen = torch.Generator().manual_seed(seed)
    picks = windows(seqs, length)

    def step_loss():
        idx = torch.randint(0, len(picks), (batch,), generator=gen).tolist()
        f, e, tgt, mask, pos = window_batch(seqs, [picks[i] for i in idx], length, embed, noise, gen)
        pred = head(f, e, pos)[mask]
        tgt = tgt[mask]
        v_loss = F.smooth_l1_loss(pred, tgt)
        with torch.no_grad():
            p = torch.softmax(tgt @ W.T, -1)
        p_loss = -(p * torch.log_softmax(pred @ W.T, -1)).sum(-1).mean()
        return (
            v_loss + kl_weight * p_loss,
            f"(feature {float(v_loss.detach()):.4f}, token {float(p_loss.detach()):.4f})",
        )

    return train_head(
        head,
        params,
        opt,
        step_loss,
        lr=lr,
        warmup=warmup,
        steps=steps,
        clip=0.5,
        desc="eagle",
        deadline=deadline,
        stop_after=stop_after,
        log=log,
        log_every=log_every,
        eval_every=eval_every,
        evaluate=evaluate,
    )


def run(cfg: dict[str, Any]) -> dict[str, Any]:
    # the console shows the progress bar, the held-out figures and the rest; every line goes to train.log
    job = start_run(
        threads=cfg["threads"],
        seed=cfg["seed"],
        work_dir=cfg["work_dir"],
        echo=lambda msg: not msg.startswith("step ") or "held-out" in msg,
    )
    log, t0 = job.log, job.t0
    spec, model, tokenizer = load_frozen_target(cfg["pair"])
    data = feature_data(model, tokenizer, cfg["data"], cfg["seed"], job.work / "data.pt", log)
    embed = model.get_input_embeddings()
    lm = model.get_output_embeddings().weight.detach()

    token_map = None
    vmap = cfg["head"].get("vocab_map")
    if vmap:
        token_map = torch.tensor(json.loads(repo_path(vmap).read_text()), dtype=torch.long)
        log(f"restricted head: {token_map.numel()} ids from {vmap}")
    W = lm if token_map is None else lm[token_map]

    torch.manual_seed(cfg["seed"])
    head = EagleHead(eagle_config(model.config), bias=True, embed_tokens=False)
    layer = model.model.layers[-1]  # start the decoder layer from the target's last layer (a sensible init)
    head.layers[0].load_state_dict(layer.state_dict(), strict=False)
    torch.nn.init.zeros_(head.fc.bias)
    with torch.no_grad():  # fc starts as "pass the feature through"
        h = model.config.hidden_size
        head.fc.weight.zero_()
        head.fc.weight[:, h:] = torch.eye(h)
        head.fc.weight[:, :h] = torch.randn(h, h) * 0.02

    with torch.no_grad():
        seqs = {tag: split_sequences(*data[tag]) for tag in data}
    tc = cfg["train"]
    warper = Warper(1.0, 10, 0.9)
    curve: list[dict[str, Any]] = []

    def evaluate(step: int) -> None:
        point: dict[str, Any] = {"step": step, "minutes": round((time.time() - t0) / 60, 2)}
        for tag in ("heldout_stdlib", "heldout_answers"):
            r = heldout_alpha(head, seqs[tag], W, tc["length"], embed, warper)
            point[tag] = {k: round(v, 4) if isinstance(v, float) else v for k, v in r.items()}
        curve.append(point)
        log(
            f"step {step} held-out alpha (T=1, top-k 10, top-p 0.9): stdlib {point['heldout_stdlib']['alpha']:.3f} "
            f"answers {point['heldout_answers']['alpha']:.3f}; top-1 {point['heldout_stdlib']['top1']:.3f} / "
            f"{point['heldout_answers']['top1']:.3f}"
        )

    evaluate(0)
    steps = train_eagle(
        head,
        seqs["train"],
        W,
        embed,
        steps=tc["steps"],
        batch=tc["batch"],
        length=tc["length"],
        lr=tc["lr"],
        warmup=tc["warmup"],
        weight_decay=tc["weight_decay"],
        kl_weight=tc["kl_weight"],
        noise=tc["noise"],
        seed=cfg["seed"],
        stop_after=tc.get("stop_after_steps"),
        deadline=t0 + tc["time_budget_s"],
        log=log,
        log_every=tc["log_every"],
        eval_every=tc["eval_every"],
        evaluate=evaluate,
    )
    if not curve or curve[-1]["step"] != steps:
        evaluate(steps)
    out_dir = repo_path(cfg["out_dir"])
    info = {
        "base_model": spec.target.id,
        "base_gguf_file": spec.target.gguf_file,
        "lm_head": "the target's own (not stored)"
        + (f", restricted to {token_map.numel()} ids" if token_map is not None else ""),
        "train_tokens": int(data["train"][0].shape[0]),
        "heldout_tokens": {t: int(data[t][0].shape[0]) for t in ("heldout_stdlib", "heldout_answers")},
        "train": {**{k: tc[k] for k in ("steps", "batch", "length", "lr", "kl_weight", "noise")}, "steps_run": steps},
        "heldout_alpha_curve": curve,
        "seed": cfg["seed"],
        "command": cfg.get("command", "python -m pipeline.train_eagle"),
        "minutes": job.minutes(),
    }
    save_eagle_head(head, out_dir, token_map=token_map, **info)
    (out_dir / "metrics.json").write_text(json.dumps(info, indent=2) + "\n")
    write_card(out_dir, info, head)
    log(f"saved EAGLE head to {out_dir}")
    return info


def write_card(out_dir: Path, info: dict[str, Any], head: EagleHead) -> None:
    """MODEL_CARD.md beside the head: data, shape, the held-out alpha curve, the command."""
    c = head.config
    n_params = sum(p.numel() for p in head.parameters())
    lines = [
        f"# EAGLE-1/2 head for {info['base_model']}",
        "",
        (
            f"Made by `{info['command']}` (seed {info['seed']}, one torch thread; {info['minutes']} min on a shared "
            "2-core CPU)."
        ),
        "",
        "- Architecture (EAGLE-1/2, SafeAILab layout): fc(cat(emb(x_{t+1}), f_t)) 2h -> h with bias, one Llama decoder",
        (
            f"  layer without input norm (hidden {c.hidden_size}, FFN {c.intermediate_size}, {c.num_attention_heads} "
            "heads,"
        ),
        (
            f"  {c.num_key_value_heads} KV heads), the target's own LM head and embedding (not stored); "
            f"{n_params / 1e6:.2f}M parameters."
        ),
        f"- LM head: {info['lm_head']}; q = 0 outside it (verification stays exact).",
        (
            "- Data (offline, never evaluation prompts): `pipeline.training.teacher_data.feature_data` - "
            "standard-library source shown"
        ),
        (
            "  as chat answers and the target's own sampled answers (T = 1, top-k 10, top-p 0.9) to instruction "
            "prompts written"
        ),
        (
            f"  there; {info['train_tokens']} training tokens; held-out: other stdlib files and other prompts "
            f"({info['heldout_tokens']})."
        ),
        (
            f"- Training: teacher-forced windows, smooth-L1 on the next feature + {info['train']['kl_weight']} x "
            "cross-entropy"
        ),
        (
            f"  against the target's next-token row, uniform feature noise {info['train']['noise']}; AdamW lr "
            f"{info['train']['lr']},"
        ),
        (
            f"  {info['train']['batch']} windows x {info['train']['length']} tokens per step, schedule of "
            f"{info['train']['steps']} steps,"
        ),
        f"  {info['train']['steps_run']} run.",
        "",
        (
            "Held-out alpha (teacher-forced first draft token: sum_x min(p, q) of the warped rows, T = 1, top-k 10, "
            "top-p 0.9)"
        ),
        "and top-1 agreement, against training steps:",
        "",
        "| step | minutes | alpha (stdlib) | alpha (answers) | top-1 (stdlib) | top-1 (answers) |",
        "|---|---|---|---|---|---|",
    ]
    for p in info["heldout_alpha_curve"]:
        a, b = p["heldout_stdlib"], p["heldout_answers"]
        lines.append(
            f"| {p['step']} | {p['minutes']} | {a['alpha']:.3f} | {b['alpha']:.3f} | {a['top1']:.3f} | {b['top1']:.3f} "
            "|"
        )
    lines += [
        "",
        (
            f"Load: `eagle: models/{out_dir.name}` in a pair config (`pipeline.decoding.eagle.load_eagle`; the head is "
            f"passed to decoders as `assets={'eagle': head}`)."
        ),
        "",
    ]
    (out_dir / "MODEL_CARD.md").write_text("\n".join(lines))
