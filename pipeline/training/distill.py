"""Distil a small draft model for a pair's target (python -m pipeline.distill pair=<pair> ...).

Stages, each cached so that a re-run continues where it stopped:

1. teacher data (``pipeline.training.teacher_data``): the target's sampled answers to offline prompts and
   teacher-forced standard-library code, with the teacher's top-k log-probs per position;
2. held-out set: the target's sampled answers (T=1, top-k 10, top-p 0.9) to HumanEval and MT-Bench
   prompts, never trained on, with the target's *warped* next-token rows: the alpha of section 3;
3. training: a small Llama student (embedding initialised from the SVD of the target's), forward KL
   to the teacher's top-k plus one rest-of-vocabulary bucket, with the output vocabulary restricted to
   the ``vocab_map_size`` tokens carrying the most teacher mass (``restricted_head_map.json``) and random
   negatives from outside the map so that the full tied head stays usable too;
4. checkpoint + model card under ``out_dir``; held-out alpha and greedy agreement logged as it trains.

The checkpoint is a stock ``LlamaForCausalLM`` (tied 49,152-token embedding, bf16) that works as a
full-vocabulary draft anywhere. Its ``restricted_head_map.json`` lists the target ids of the
restricted head; ``pipeline.decoding.vocab.restrict_head`` turns a loaded model into one whose logits
cover only those ids and records the map as ``model.draft_token_map`` (logit i -> target id): the
decoding engine's restricted-vocabulary contract (q = 0 elsewhere, verification stays exact).
"""

from __future__ import annotations

import json
import math
import random
import time
from pathlib import Path

import torch
from omegaconf import OmegaConf
from tqdm import tqdm
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

from pipeline.data import humaneval
from pipeline.decoding.fast_forward import model_kernel_path
from pipeline.decoding.kv import CachedModel
from pipeline.decoding.vocab import read_token_map, restrict_head, save_token_map
from pipeline.decoding.warping import warp
from pipeline.measure.costs import step_times
from pipeline.models import DTYPES, load_pair
from pipeline.prompts import chat_ids
from pipeline.training.cards import write_model_card
from pipeline.training.chat_mix import Conversation, chat_conversations
from pipeline.training.common import repo_path, start_run
from pipeline.training.teacher_data import (
    chat_heldout_conversations,
    generate_teacher_data,
    load_records,
    padding_id,
    sample_answers,
    sample_answers_packed,
    sample_conversations,
)

WARP = dict(temperature=1.0, top_k=10, top_p=0.9)


# --------------------------------------------------------------------------------------------------
# Student
# --------------------------------------------------------------------------------------------------


def make_student(
    target,
    *,
    hidden_size: int,
    num_layers: int,
    intermediate_size: int,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    seed: int,
    init_from_target: bool = True,
):
    """A small Llama with the target's vocabulary; embedding = target embedding's top-d SVD projection."""
    tc = target.config
    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=tc.vocab_size,
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        head_dim=head_dim,
        max_position_embeddings=tc.max_position_embeddings,
        rope_theta=getattr(tc, "rope_theta", None) or tc.rope_parameters.get("rope_theta", 10000.0),
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
        bos_token_id=tc.bos_token_id,
        eos_token_id=tc.eos_token_id,
        pad_token_id=tc.pad_token_id,
        hidden_act="silu",
    )
    student = LlamaForCausalLM(cfg)
    if init_from_target:
        emb = target.get_input_embeddings().weight.detach().float()
        # top-d right singular vectors: E ~ (E V_d) V_d^T, so E V_d keeps most of the logit geometry
        _, s, vh = torch.linalg.svd(emb - emb.mean(0), full_matrices=False)
        proj = emb @ vh[:hidden_size].T
        proj = proj * (emb.norm(dim=1).mean() / proj.norm(dim=1).mean())
        student.get_input_embeddings().weight.data.copy_(proj)
        # At init the residual stream is mostly the input token's own embedding, so with a unit final
        # norm the student would predict "repeat the input" with logits ~sqrt(d)*|e|. Scale the final
        # norm so that this self-logit is ~4 (unrelated tokens get std ~4/sqrt(d)): a near-uniform start.
        student.model.norm.weight.data.fill_(4.0 / (hidden_size**0.5 * float(proj.norm(dim=1).mean())))
    student.tie_weights()
    return student


# --------------------------------------------------------------------------------------------------
# Held-out set and alpha
# --------------------------------------------------------------------------------------------------


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

    if prompts and isinstance(prompts[0], Conversation):
        recs = sample_conversations(tokenizer, list(prompts), sample)
        shown = [list(c.turns) for c in prompts]
    else:
        recs = sample([chat_ids(tokenizer, p) for p in prompts])
        shown = list(prompts)
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


def data_engine(engine: str, target) -> str:
    """``data.engine``: ``auto`` is ``packed`` where the target runs on the engine's bf16 CPU kernels (many
    sequences per weight stream through the batch-1 kernels), else ``batched`` (transformers, e.g. a GPU)."""
    if engine == "auto":
        return "packed" if model_kernel_path(target) == "bf16-avx512" else "batched"
    if engine not in ("batched", "packed"):
        raise ValueError(f"data.engine must be auto, batched or packed, not {engine!r}")
    return engine


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


# --------------------------------------------------------------------------------------------------
# Training
# --------------------------------------------------------------------------------------------------


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
    batches, cur, width = [], [], 0
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
    flat_pos, t_ids, t_logp = [], [], []
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
        t_ids.append(r["topk_ids"][keep].long())
        t_logp.append(r["topk_logp"][keep].float())
    t_ids = torch.cat(t_ids)
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
    decay, no_decay = [], []
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
    curve, epoch, batches, ema = [], 0, [], None
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


# --------------------------------------------------------------------------------------------------
# Checkpoint and model card
# --------------------------------------------------------------------------------------------------


def save_checkpoint(student, token_map: torch.Tensor | None, out_dir: Path, dtype: str = "bfloat16") -> None:
    """A stock transformers checkpoint (tied embedding) plus ``restricted_head_map.json`` when restricted."""
    out_dir.mkdir(parents=True, exist_ok=True)
    student.to(DTYPES[dtype]).save_pretrained(out_dir)
    student.float()
    save_token_map(token_map, out_dir, student.config.vocab_size)


def step_cost(model, *, context: int = 128, reps: int = 40) -> float:
    """Median ms of one batch-1 single-token step with a KV cache after a ``context``-token prompt (the engine's path)."""
    generator = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, model.get_input_embeddings().weight.shape[0], (context,), generator=generator).tolist()
    return 1e3 * step_times(model, prompt, 1, next(model.parameters()).device, reps=reps)[0]


def cost_figures(target, draft_dir: Path) -> dict[str, float]:
    """Step times of the target and of the saved draft (full and restricted head), both in the target's
    precision as the pair serves them, and their ratios c."""
    tgt_ms = step_cost(target)
    full_ms = step_cost(AutoModelForCausalLM.from_pretrained(draft_dir, dtype=target.dtype).eval())
    res_ms = step_cost(restrict_head(AutoModelForCausalLM.from_pretrained(draft_dir, dtype=target.dtype).eval()))
    return {
        "target_ms": tgt_ms,
        "draft_ms_full": full_ms,
        "draft_ms_restricted": res_ms,
        "c_full": full_ms / tgt_ms,
        "c_restricted": res_ms / tgt_ms,
        "dtype": str(target.dtype).removeprefix("torch."),
    }


# --------------------------------------------------------------------------------------------------
# Entry point
# --------------------------------------------------------------------------------------------------


def heldout_sets(cfg, target, tok, engine: str, work: Path, train_firsts: set[str], log) -> dict[str, dict]:
    """The held-out sets of ``cfg.heldout``, built once and cached in ``work``: ``eval`` (HumanEval + MT-Bench
    first turns: the shipped draft's held-out set) and, with ``n_chat``, ``chat`` (conversations of the chat
    mix's held-out split, none of whose first turns the training data has)."""
    h = cfg.heldout
    out = {}
    held_file = work / f"heldout-he{h.n_humaneval}-mt{h.n_mtbench}-n{h.max_new_tokens}-s{h.seed}.pt"
    if not held_file.exists():
        prompts = heldout_prompts(h.n_humaneval, h.n_mtbench, h.get("mt_bench_path"))
        torch.save(
            build_heldout(target, tok, prompts, max_new_tokens=h.max_new_tokens, seed=h.seed, engine=engine), held_file
        )
    out["eval"] = torch.load(held_file)
    n_chat = h.get("n_chat", 0)
    if n_chat:
        chat_file = work / f"heldout-chat{n_chat}-n{h.max_new_tokens}-s{h.seed}-d{cfg.seed}.pt"
        if not chat_file.exists():
            convs = chat_heldout_conversations(n_chat, cfg.seed, train_firsts)
            torch.save(
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


def run(cfg) -> dict:
    """The whole distillation run described by ``cfg`` (conf/distill.yaml)."""
    # the student and the training loop seed themselves (make_student, train): no global seed here
    job = start_run(threads=cfg.threads, seed=None, work_dir=cfg.work_dir, log_name="distill.log")
    log, work = job.log, job.work
    d = cfg.data
    kind = d.get("prompts", "instructions")
    if kind not in ("instructions", "chat"):
        raise ValueError(f"data.prompts must be instructions or chat, not {kind!r}")
    init_from = cfg.get("init_from")
    if init_from and not (repo_path(init_from) / "config.json").exists():
        raise ValueError(f"init_from={init_from}: no checkpoint there (a folder written by pipeline.distill)")

    pair_cfg = OmegaConf.to_container(cfg.pair, resolve=True)
    pair_cfg["draft"] = None  # the draft is what we are making
    pair_cfg.pop("drafter", None)
    pair = load_pair(pair_cfg)
    target, tok = pair.target.eval(), pair.tokenizer  # the teacher in the pair's precision (the one that serves)
    pad_id = padding_id(tok)
    data_dir = work / "data"
    engine = data_engine(d.get("engine", "auto"), target)
    log(f"teacher: {target.dtype}, data engine {engine}")

    # 1. held-out sets (first: small, and fixed before any training data exists)
    train_firsts = (
        {c.turns[0] for c in chat_conversations(d.n_prompts, cfg.seed, "train", d.get("multi_turn", 0.4))}
        if kind == "chat"
        else set()
    )
    held = heldout_sets(cfg, target, tok, engine, work, train_firsts, log)
    heldout = held.pop("eval")
    h = cfg.heldout

    # 2. teacher data
    t0 = time.time()
    generate_teacher_data(
        target,
        tok,
        data_dir,
        n_prompts=d.n_prompts,
        tf_fraction=d.tf_fraction,
        batch_size=d.batch_size,
        max_new_tokens=d.max_new_tokens,
        top_k_store=d.top_k_store,
        sample_top_k=d.sample_top_k,
        sample_top_p=d.sample_top_p,
        seed=cfg.seed,
        time_budget_s=d.time_budget_s,
        max_shards=d.get("max_shards"),
        engine=engine,
        slots=d.get("slots", 64),
        prompts=kind,
        multi_turn=d.get("multi_turn", 0.4),
        log=log,
    )
    new_gen_s = time.time() - t0
    stamp = data_dir / "wall_s.json"
    wall = json.loads(stamp.read_text())["wall_s"] if stamp.exists() else 0.0
    stamp.write_text(json.dumps({"wall_s": wall + new_gen_s}))
    if cfg.get("stop_after") == "data":
        log("stop_after=data: teacher data and held-out sets written, no training")
        return {}
    records = load_records(data_dir)
    n_tok = sum(len(r["topk_ids"]) for r in records)
    log(f"data: {len(records)} records, {n_tok} answer tokens, generation wall {(wall + new_gen_s) / 60:.1f} min")

    # 3. student and training
    s = cfg.student
    if init_from:  # continue training a saved draft: its weights and its restricted head's map
        token_map = read_token_map(repo_path(init_from))
        if token_map is None:
            token_map = torch.arange(target.config.vocab_size)
    else:
        token_map = choose_token_map(
            records,
            target.config.vocab_size,
            s.vocab_map_size,
            always=[i for i in {tok.eos_token_id, tok.bos_token_id, pad_id} if i is not None],
        )
    in_map = torch.zeros(target.config.vocab_size, dtype=torch.bool)
    in_map[token_map] = True
    cov = sum((r["topk_logp"].float().exp() * in_map[r["topk_ids"].long()]).sum().item() for r in records)
    tot = sum(r["topk_logp"].float().exp().sum().item() for r in records)
    log(f"token map: {token_map.numel()} ids, coverage of the teacher's top-k mass {cov / tot:.4f}")
    if init_from:
        student = AutoModelForCausalLM.from_pretrained(repo_path(init_from), dtype=torch.float32)
        log(f"student: continued from {init_from}")
    else:
        student = make_student(
            target,
            hidden_size=s.hidden_size,
            num_layers=s.num_layers,
            intermediate_size=s.intermediate_size,
            num_heads=s.num_heads,
            num_kv_heads=s.num_kv_heads,
            head_dim=s.head_dim,
            seed=cfg.seed,
            init_from_target=s.init_from_target,
        )
    tr = cfg.train
    t1 = time.time()
    curve = train(
        student,
        records,
        token_map,
        heldout,
        steps=tr.steps,
        tokens_per_batch=tr.tokens_per_batch,
        max_len=tr.max_len,
        lr=tr.lr,
        warmup=tr.warmup,
        weight_decay=tr.weight_decay,
        negatives=tr.negatives,
        eval_every=tr.eval_every,
        seed=cfg.seed,
        pad_id=pad_id,
        log=log,
        progress=cfg.progress,
        extra_heldout=held,
    )
    train_wall = time.time() - t1
    final = curve[-1] if curve else {}
    final_full = evaluate_alpha(student, heldout, None)
    log(f"final: alpha {final.get('alpha')} (restricted), {final_full['alpha']:.4f} (full head)")

    # 4. checkpoint, cost ratio, model card
    out_dir = repo_path(cfg.out_dir)
    save_checkpoint(student, token_map, out_dir, cfg.save_dtype)
    figures = {}
    if cfg.measure_cost:
        figures = cost_figures(target, out_dir)
        log(
            f"cost: target {figures['target_ms']:.2f} ms, draft {figures['draft_ms_full']:.2f} ms full head / "
            f"{figures['draft_ms_restricted']:.2f} ms restricted"
        )
    n_params = sum(p.numel() for p in student.parameters())
    size = sum(f.stat().st_size for f in out_dir.glob("*.safetensors"))
    info = {
        "target": pair.spec.target.id,
        "seed": cfg.seed,
        "save_dtype": cfg.save_dtype,
        "command": cfg.get("command_line") or "python -m pipeline.distill pair=" + pair.spec.name,
        "config": OmegaConf.to_container(cfg, resolve=True),
        "student": {
            **OmegaConf.to_container(s),
            "vocab_size": target.config.vocab_size,
            "params": n_params,
            "bytes": size,
            "map_size": int(token_map.numel()),
        },
        "data": {
            **OmegaConf.to_container(d),
            "engine_used": engine,
            "records": len(records),
            "tokens": n_tok,
            "gen_records": sum(r["kind"] == "gen" for r in records),
            "gen2_records": sum(r["kind"] == "gen2" for r in records),
            "tf_records": sum(r["kind"] == "tf" for r in records),
            "wall_s": wall + new_gen_s,
            "map_coverage": cov / tot,
        },
        "train": {**OmegaConf.to_container(tr), "wall_s": train_wall},
        "heldout": {
            **OmegaConf.to_container(h),
            "positions": {
                "eval": sum(len(r["p"]) for r in heldout["rows"]),
                **{k: sum(len(r["p"]) for r in v["rows"]) for k, v in held.items()},
            },
        },
        "init_from": init_from,
        "curve": curve,
        "final": final,
        "final_full": final_full,
        "figures": figures,
    }
    write_model_card(out_dir, info)
    log(f"wrote {out_dir}")
    return info
