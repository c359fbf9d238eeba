"""Train an EAGLE-3 head for a pair's target with the target frozen (CLI: ``python -m pipeline.train_eagle
--config-name train_eagle3``), following the authors' training code (SafeAILab/EAGLE ``eagle/traineagle3/``:
``cnets.py`` ``Model.forward`` / ``LlamaAttention`` and ``main.py``).

What it does, as the authors' code does:

- features: the frozen target's hidden states at the inputs of decoder layers 2, L//2, L-3 (``default_taps``;
  the engine's ``Eagle3Head.layers_of``) concatenated to ``[3 h]``; ``fc`` maps them to h at step 0;
- training-time test (TTT), ``ttt_steps`` (authors: 7) unrolled steps over the same rows: step 0 reads
  row t = (f_t, x_{t+1}) and predicts x_{t+2}; step j >= 1 feeds the head's own step j-1 output at row t
  in place of the target features while the tokens and the targets move one position on (x_{t+j+1} in,
  x_{t+j+2} predicted; the authors' ``padding(..., left=False)``), rotary positions ``t + j``. Attention at
  step j sees the keys/values of steps 0..j through the authors' extended mask (``ttt_mask``): the causal
  prefix of step 0 and, of steps 1..j, only the row's own (diagonal) entry;
- loss of step j: the authors' forward KL, ``-mean(mask * sum_v p_v log q_v)`` with ``q`` the head's
  draft-vocabulary softmax and ``p`` the target's softmax over its logits restricted to the draft
  vocabulary, rows masked where the target's argmax falls outside it (or past the text); the steps are
  weighted ``0.8 ** j`` and summed (``main.py``);
- the draft vocabulary: the ``draft_vocab_size`` most frequent ids of the training text, sorted; draft
  id i is target id ``i + d2t[i]``, ``t2d`` marks the covered ids (``Model.scandata``). The head reads the
  target's input embedding (frozen, not stored, as the authors load it).

Deviations (CPU-sized; all in ``conf/train_eagle3.yaml`` and the card):

- data: the project's offline feature corpus (``teacher_data.feature_sequences``: standard-library source
  as chat answers and the target's sampled answers; never evaluation prompts), every token counted and
  trained on (the authors count and train assistant turns of ShareGPT/UltraChat only), cut in windows
  of ``length`` rows (the authors train whole conversations of up to 2048 tokens);
- optimisation: AdamW (betas 0.9, 0.95, no weight decay, gradient clipping 0.5, as ``ds_config.json``)
  with linear warm-up + cosine decay at lr 1e-3 over hundreds of steps (authors: 5e-5, 12k warm-up
  steps of 800k, fp16); float32, one torch thread, deterministic from the seed;
- ``init_from_target`` (default on): ``lm_head`` starts as the target's LM head rows of the draft ids
  and ``norm`` as the target's final norm (the authors start both at random / ones); off = the authors';
- if the text holds fewer distinct ids than ``draft_vocab_size``, the vocabulary is filled up with the
  lowest unseen ids (the authors' ``most_common(N)`` would leave it short of the head's size).

Held-out alpha, logged every ``eval_every`` steps: the expected acceptance ``sum_x min(p(x), q(x))`` of the
head's first draft token (step 0, target features) against the target's next-token row, both warped as
sampled decoding warps them (T = 1, top-k 10, top-p 0.9; q = 0 outside the draft vocabulary).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, cast

import torch
import torch.nn.functional as F
from transformers import DynamicCache

from pipeline.decoding.eagle3 import Eagle3Head, default_taps, eagle3_config, save_eagle3_head
from pipeline.decoding.warping import Warper
from pipeline.training.common import load_frozen_target, repo_path, start_run, train_head
from pipeline.training.feature_corpus import feature_sequences

LOSS_DECAY = 0.8  # the authors' weight of step j: 0.8 ** j


# --------------------------------------------------------------------------------------------------
# Data: the target's three tapped layers and its last hidden state over the feature corpus
# --------------------------------------------------------------------------------------------------


@torch.no_grad()
def tap_states(model, sequences: list[list[int]], taps, log=print, tag: str = "") -> list[dict[str, torch.Tensor]]:
    """Per sequence: ``feats [L, 3h]`` (inputs of decoder layers ``taps``), ``last [L, h]`` (the final-normed
    last hidden state, the LM head's input) and ``ids [L]``; sequences shorter than 3 tokens are left out."""
    out = []
    for i, s in enumerate(sequences):
        if len(s) < 3:
            continue
        x = torch.tensor([s])
        hs = model.get_decoder()(input_ids=x, output_hidden_states=True)
        feats = torch.cat([hs.hidden_states[t][0] for t in taps], -1).float()
        out.append({"feats": feats, "last": hs.last_hidden_state[0].float(), "ids": x[0]})
        if (i + 1) % 20 == 0:
            log(f"tapped hidden states [{tag}] {i + 1}/{len(sequences)}")
    return out


def draft_vocab(token_ids: torch.Tensor, size: int, vocab_size: int) -> tuple[torch.Tensor, float]:
    """The ``size`` most frequent ids of ``token_ids`` (ties: the lower id), sorted, and the share of the text
    they cover (the authors' ``top N token frequency ratio``); filled up with the lowest unseen ids if the text
    has fewer distinct ids."""
    counts = torch.bincount(token_ids.flatten().long(), minlength=vocab_size)
    order = sorted(range(vocab_size), key=lambda i: (-int(counts[i]), i))  # stable: count down, then id up
    ids = torch.tensor(order[:size], dtype=torch.long)
    coverage = float(counts[ids].sum()) / max(float(counts.sum()), 1.0)
    return ids.sort().values, coverage


def windows(seqs, length: int) -> list[tuple[int, int]]:
    """(sequence index, start) of non-overlapping windows of ``length`` rows (a row needs x_{t+1})."""
    return [(i, start) for i, s in enumerate(seqs) for start in range(0, s["ids"].numel() - 1, length)]


def ttt_batch(seqs, picks, length: int, steps: int) -> dict[str, torch.Tensor]:
    """A padded batch for ``steps`` unrolled steps: target features of rows t = 0..length-1, and for
    ``steps + length - 1`` extended positions p = t + j (token ids x_{s+p+1}, the target's last hidden state
    there, whether it exists). Step j reads extended positions j..j+length-1."""
    ext = length + steps - 1
    feats, ids, last, valid = [], [], [], []
    for i, start in picks:
        s = seqs[i]
        f = s["feats"][start : start + length]
        feats.append(F.pad(f, (0, 0, 0, length - f.shape[0])))
        x = s["ids"][start + 1 : start + 1 + ext]
        n = x.numel()
        ids.append(F.pad(x, (0, ext - n)))
        last.append(F.pad(s["last"][start + 1 : start + 1 + ext], (0, 0, 0, ext - n)))
        valid.append(torch.arange(ext) < n)
    return {
        "feats": torch.stack(feats),
        "ids": torch.stack(ids),
        "last": torch.stack(last),
        "valid": torch.stack(valid),
    }


# --------------------------------------------------------------------------------------------------
# Training-time test
# --------------------------------------------------------------------------------------------------


def ttt_mask(n: int, step: int) -> torch.Tensor:
    """The authors' attention mask of unrolled step ``step`` (0-based) over the keys of steps 0..step, laid out
    step after step (``[n, (step + 1) n]``, True = attend): row t sees keys 0..t of step 0 and, of each later
    step i <= step, only its own key t (``cnets.LlamaAttention``: causal over ``cache_k[0]``, then
    ``(q * k_i).sum(-1)`` for the diagonal entries of ``cache_k[1:]``)."""
    eye = torch.eye(n, dtype=torch.bool)
    causal = torch.ones(n, n, dtype=torch.bool).tril()
    return torch.cat([causal] + [eye] * step, dim=1)


def ttt_forward(head: Eagle3Head, feats: torch.Tensor, embed_ext: torch.Tensor, steps: int) -> list[torch.Tensor]:
    """The head unrolled for ``steps`` steps; returns each step's output (before ``norm``) ``[b, n, h]``.

    Step 0 reads the target features ``feats [b, n, 3h]``, step j the head's own step j-1 output at the same
    rows; ``embed_ext [b, n + steps - 1, h]``: embeddings of x_{t+1+j} (step j reads ``[:, j : j + n]``);
    rotary positions ``t + j``; keys/values of every step stay in one cache, seen through ``ttt_mask``."""
    b, n = feats.shape[:2]
    cache = DynamicCache()
    positions = torch.arange(n)[None].expand(b, n)
    hidden, outs = feats, []
    for j in range(steps):
        mask = ttt_mask(n, j)[None, None].expand(b, 1, n, (j + 1) * n)
        out = head(hidden, embed_ext[:, j : j + n], positions + j, cache=cache, mask=mask)
        outs.append(out)
        hidden = out
    return outs


def ttt_loss(
    head: Eagle3Head, batch: dict[str, torch.Tensor], W: torch.Tensor, embed, steps: int
) -> tuple[torch.Tensor, list[float], list[float]]:
    """The authors' TTT loss: ``sum_j 0.8**j * ploss_j``; also each step's loss and top-1 agreement (on the
    rows it is computed over). ``W``: the target's LM head ``[V, h]``."""
    n = batch["feats"].shape[1]
    with torch.no_grad():
        emb = embed(batch["ids"])
        target_logits = batch["last"] @ W.T  # [b, n + steps - 1, V]: the target's rows predicting x_{t+j+2}
        in_draft = head.t2d[target_logits.argmax(-1)] & batch["valid"]
        target_p = torch.softmax(target_logits[..., head.t2d], -1)  # over the draft vocabulary (sorted ids)
    outs = ttt_forward(head, batch["feats"], emb, steps)
    total: float | torch.Tensor = 0.0
    losses: list[float] = []
    accs: list[float] = []
    for j, out in enumerate(outs):
        logp = torch.log_softmax(head.draft_logits(out).float(), -1)
        p, m = target_p[:, j : j + n], in_draft[:, j : j + n]
        loss = -(m[..., None] * p * logp).sum(-1).mean()
        total = total + LOSS_DECAY**j * loss
        losses.append(float(loss.detach()))
        with torch.no_grad():
            accs.append(
                float(((logp.argmax(-1) == p.argmax(-1)) & m).sum()) / max(int(batch["valid"][:, j : j + n].sum()), 1)
            )
    return cast(torch.Tensor, total), losses, accs  # a tensor after the first step (steps >= 1)


@torch.no_grad()
def heldout_alpha(
    head: Eagle3Head, seqs, W: torch.Tensor, length: int, embed, warper: Warper, batch: int = 8
) -> dict[str, float]:
    """Teacher-forced first-draft-token acceptance (warped, q = 0 outside the draft vocabulary) and top-1
    agreement of the head (step 0, target features) with the target's next-token row, on held-out sequences."""
    head.eval()
    picks = windows(seqs, length)
    targets = head.draft_to_target()
    acc_sum, top1, total = 0.0, 0.0, 0
    for b in range(0, len(picks), batch):
        x = ttt_batch(seqs, picks[b : b + batch], length, 1)
        out = head(x["feats"], embed(x["ids"]), torch.arange(length)[None].expand(x["ids"].shape[0], length))
        mask = x["valid"]
        P = warper(x["last"][mask] @ W.T)
        z = torch.full_like(P, float("-inf"))
        z[:, targets] = head.draft_logits(out[mask]).float()
        Q = warper(z)
        acc_sum += float(torch.minimum(P, Q).sum(-1).sum())
        top1 += float((P.argmax(-1) == Q.argmax(-1)).sum())
        total += int(mask.sum())
    return {"alpha": acc_sum / max(total, 1), "top1": top1 / max(total, 1), "tokens": total}


def new_head(model, draft_ids: torch.Tensor, *, init_from_target: bool, seed: int) -> Eagle3Head:
    """A fresh EAGLE-3 head for ``model`` over the draft vocabulary ``draft_ids`` (seeded)."""
    torch.manual_seed(seed)
    head = Eagle3Head(eagle3_config(model.config), int(draft_ids.numel()))
    head.set_vocab(draft_ids)
    if init_from_target:
        with torch.no_grad():
            head.lm_head.weight.copy_(model.get_output_embeddings().weight[head.draft_to_target()])
            head.norm.weight.copy_(model.get_decoder().norm.weight)
    return head


def train_eagle3(
    head: Eagle3Head,
    seqs,
    W: torch.Tensor,
    embed,
    *,
    steps: int,
    batch: int,
    length: int,
    ttt_steps: int,
    lr: float,
    warmup: int,
    weight_decay: float,
    betas=(0.9, 0.95),
    clip: float = 0.5,
    seed: int,
    stop_after: int | None = None,
    deadline: float | None = None,
    log=print,
    log_every: int = 10,
    eval_every: int = 0,
    evaluate=None,
) -> int:
    """TTT training of ``head`` on frozen target features; returns the number of steps run."""
    params = [p for p in head.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, betas=tuple(betas), weight_decay=weight_decay)
    gen = torch.Generator().manual_seed(seed)
    picks = windows(seqs, length)

    def step_loss():
        idx = torch.randint(0, len(picks), (batch,), generator=gen).tolist()
        loss, losses, accs = ttt_loss(
            head, ttt_batch(seqs, [picks[i] for i in idx], length, ttt_steps), W, embed, ttt_steps
        )
        return loss, f"per step {' '.join(f'{v:.3f}' for v in losses)} acc {' '.join(f'{v:.2f}' for v in accs)}"

    return train_head(
        head,
        params,
        opt,
        step_loss,
        lr=lr,
        warmup=warmup,
        steps=steps,
        clip=clip,
        desc="eagle3",
        deadline=deadline,
        stop_after=stop_after,
        log=log,
        log_every=log_every,
        eval_every=eval_every,
        evaluate=evaluate,
    )


def run(cfg: dict[str, Any]) -> dict[str, Any]:
    """The CLI's run: the frozen target, the corpus's tapped states (cached in the work folder), ``fit``."""
    job = start_run(
        threads=cfg["threads"],
        seed=cfg["seed"],
        work_dir=cfg["work_dir"],
        echo=lambda msg: not msg.startswith("step ") or "held-out" in msg,
    )
    spec, model, tokenizer = load_frozen_target(cfg["pair"])
    cache = job.work / "data3.pt"
    if cache.exists():
        job.log(f"loaded cached data {cache}")
        data = torch.load(cache)
    else:
        sequences = feature_sequences(model, tokenizer, cfg["data"], cfg["seed"], job.log)
        taps = default_taps(model.config.num_hidden_layers)
        data = {tag: tap_states(model, seqs, taps, job.log, tag) for tag, seqs in sequences.items()}
        torch.save(data, cache)
    job.log("data: " + ", ".join(f"{k} {sum(s['ids'].numel() for s in v)} tokens" for k, v in data.items()))
    return fit(cfg, model, data, base_model=spec.target.id, log=job.log, t0=job.t0)


def fit(
    cfg: dict[str, Any], model, data: dict[str, list], *, base_model: str, log=print, t0: float | None = None
) -> dict[str, Any]:
    """Draft vocabulary, head, TTT training with the held-out alpha curve, then the head (``save_eagle3_head``),
    ``metrics.json`` and ``MODEL_CARD.md`` in ``cfg["out_dir"]``. ``data``: ``tap_states`` by tag (``train``
    and the held-out tags)."""
    t0 = time.time() if t0 is None else t0
    hc, tc = cfg["head"], cfg["train"]
    embed = model.get_input_embeddings()
    W = model.get_output_embeddings().weight.detach()
    train_ids = torch.cat([s["ids"] for s in data["train"]])
    ids, coverage = draft_vocab(train_ids, int(hc["draft_vocab_size"]), model.config.vocab_size)
    log(f"draft vocabulary: the {ids.numel()} most frequent training ids cover {coverage:.2%} of the training tokens")
    head = new_head(model, ids, init_from_target=bool(hc.get("init_from_target", False)), seed=cfg["seed"])
    warper = Warper(1.0, 10, 0.9)
    heldout = [t for t in data if t != "train"]
    curve: list[dict[str, Any]] = []

    def evaluate(step: int) -> None:
        point: dict[str, Any] = {"step": step, "minutes": round((time.time() - t0) / 60, 2)}
        for tag in heldout:
            r = heldout_alpha(head, data[tag], W, tc["length"], embed, warper)
            point[tag] = {k: round(v, 4) if isinstance(v, float) else v for k, v in r.items()}
        curve.append(point)
        log(
            f"step {step} held-out alpha (T=1, top-k 10, top-p 0.9): "
            + ", ".join(f"{t} {point[t]['alpha']:.3f}" for t in heldout)
            + "; top-1 "
            + ", ".join(f"{point[t]['top1']:.3f}" for t in heldout)
        )

    evaluate(0)
    steps = train_eagle3(
        head,
        data["train"],
        W,
        embed,
        steps=tc["steps"],
        batch=tc["batch"],
        length=tc["length"],
        ttt_steps=tc["ttt_steps"],
        lr=tc["lr"],
        warmup=tc["warmup"],
        weight_decay=tc["weight_decay"],
        betas=tc.get("betas", (0.9, 0.95)),
        clip=tc.get("clip", 0.5),
        seed=cfg["seed"],
        stop_after=tc.get("stop_after_steps"),
        deadline=t0 + tc["time_budget_s"] if tc.get("time_budget_s") else None,
        log=log,
        log_every=tc["log_every"],
        eval_every=tc["eval_every"],
        evaluate=evaluate,
    )
    if curve[-1]["step"] != steps:
        evaluate(steps)
    out_dir = repo_path(cfg["out_dir"])
    info = {
        "base_model": base_model,
        "taps": list(head.layers_of(model.config.num_hidden_layers)),
        "draft_vocab_size": head.draft_vocab_size,
        "draft_vocab_coverage": round(coverage, 4),
        "distinct_train_ids": int(torch.unique(train_ids).numel()),
        "init_from_target": bool(hc.get("init_from_target", False)),
        "train_tokens": int(train_ids.numel()),
        "heldout_tokens": {t: sum(int(s["ids"].numel()) for s in data[t]) for t in heldout},
        "train": {**{k: tc[k] for k in ("steps", "batch", "length", "ttt_steps", "lr", "warmup")}, "steps_run": steps},
        "heldout_alpha_curve": curve,
        "seed": cfg["seed"],
        "command": cfg.get("command", "python -m pipeline.train_eagle --config-name train_eagle3"),
        "minutes": round((time.time() - t0) / 60, 1),
    }
    save_eagle3_head(head, out_dir, dtype=getattr(torch, hc.get("save_dtype", "bfloat16")), **info)
    if hc.get("speculators_copy"):
        save_eagle3_head(
            head,
            out_dir / "speculators",
            layout="speculators",
            dtype=getattr(torch, hc.get("save_dtype", "bfloat16")),
            verifier=base_model,
            **info,
        )
    (out_dir / "metrics.json").write_text(json.dumps(info, indent=2) + "\n")
    write_card(out_dir, info, head)
    log(f"saved EAGLE-3 head to {out_dir}")
    return info


def write_card(out_dir: Path, info: dict[str, Any], head: Eagle3Head) -> None:
    """MODEL_CARD.md beside the head: data, shape, training, deviations, the held-out alpha curve, the command."""
    c, t = head.config, info["train"]
    n_params = sum(p.numel() for p in head.parameters())
    heldout = list(info["heldout_tokens"])
    lines = [
        f"# EAGLE-3 head for {info['base_model']}",
        "",
        (
            f"Made by `{info['command']}` (seed {info['seed']}, one torch thread; {info['minutes']} min wall on a "
            "shared 2-core CPU,"
        ),
        "data included)." + (f" {info['note']}" if info.get("note") else ""),
        "",
        (
            f"- Architecture (EAGLE-3, the authors' layout): fc over the inputs of target layers {info['taps']} (3h -> "
            "h), one decoder"
        ),
        (
            f"  layer over cat(norm(emb(x_{{t+1}})), norm(f_t)) (hidden {c.hidden_size}, FFN {c.intermediate_size}, "
            f"{c.num_attention_heads} heads,"
        ),
        (
            f"  {c.num_key_value_heads} KV heads), norm, LM head over a draft vocabulary of {info['draft_vocab_size']} "
            "ids; the target's input"
        ),
        f"  embedding (not stored); {n_params / 1e6:.2f}M parameters.",
        "- Draft vocabulary: the most frequent ids of the training text (d2t/t2d as the authors build them), covering",
        f"  {info['draft_vocab_coverage']:.2%} of the training tokens; q = 0 outside it (verification stays exact).",
    ]
    seen = info.get("distinct_train_ids")
    if seen is not None and seen < info["draft_vocab_size"]:
        lines.append(
            f"  The training text has {seen} distinct ids: the other {info['draft_vocab_size'] - seen} draft ids are "
            "the lowest unseen ids."
        )
    lines += [
        (
            "- Data (offline, never evaluation prompts): `pipeline.training.teacher_data.feature_sequences` - "
            "standard-library source"
        ),
        "  shown as chat answers and the target's own sampled answers to instruction prompts written there;",
        (
            f"  {info['train_tokens']} training tokens; held-out: other stdlib files and other prompts "
            f"({info['heldout_tokens']})."
        ),
        (
            f"- Training (the authors' training-time test): {t['ttt_steps']} unrolled steps, step j >= 1 fed the "
            "head's own step j-1"
        ),
        "  output, the authors' extended mask, per-step forward KL against the target's row restricted to the draft",
        "  vocabulary (rows whose target argmax is outside it masked), weights 0.8^j.",
        (
            f"  AdamW (0.9, 0.95), clip 0.5, lr {t['lr']} with {t['warmup']} warm-up steps and cosine decay over "
            f"{t['steps']} steps"
        ),
        f"  ({t['steps_run']} run), {t['batch']} windows x {t['length']} rows per step.",
        (
            "- Deviations from the authors (CPU-sized): windows of the offline corpus instead of whole ShareGPT "
            "conversations,"
        ),
        (
            "  every token trained (no assistant-only loss mask), lr 1e-3 over hundreds of steps instead of 5e-5 over "
            "800k,"
        ),
        "  float32"
        + (
            ", lm_head/norm started from the target's LM head rows and final norm." if info["init_from_target"] else "."
        ),
        "",
        (
            "Held-out alpha (teacher-forced first draft token: sum_x min(p, q) of the warped rows, T = 1, top-k 10, "
            "top-p 0.9)"
        ),
        "and top-1 agreement, against training steps:",
        "",
        "| step | minutes | "
        + " | ".join(f"alpha ({t})" for t in heldout)
        + " | "
        + " | ".join(f"top-1 ({t})" for t in heldout)
        + " |",
        "|---|---|" + "---|" * (2 * len(heldout)),
    ]
    for p in info["heldout_alpha_curve"]:
        lines.append(
            f"| {p['step']} | {p['minutes']} | "
            + " | ".join(f"{p[t]['alpha']:.3f}" for t in heldout)
            + " | "
            + " | ".join(f"{p[t]['top1']:.3f}" for t in heldout)
            + " |"
        )
    lines += [
        "",
        (
            f"Load: `eagle: models/{out_dir.name}` in a pair config, drafter `eagle3` "
            "(`pipeline.decoding.eagle3.load_eagle3_head`)."
        ),
        "",
    ]
    (out_dir / "MODEL_CARD.md").write_text("\n".join(lines))
