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

The held-out sets and their alpha are in ``distill_heldout``, the training loop in ``distill_train``.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, cast

import torch
from omegaconf import OmegaConf
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

from pipeline.decoding.fast_forward import model_kernel_path
from pipeline.decoding.vocab import read_token_map, restrict_head, save_token_map
from pipeline.measure.costs import step_times
from pipeline.models import DTYPES, load_pair
from pipeline.training.cards import write_model_card
from pipeline.training.chat_mix import chat_conversations
from pipeline.training.common import repo_path, start_run
from pipeline.training.distill_heldout import evaluate_alpha, heldout_sets
from pipeline.training.distill_train import choose_token_map, train
from pipeline.training.shards import TeacherDataError, check_folder, load_records
from pipeline.training.teacher_data import generate_teacher_data, padding_id, teacher_settings

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
    # rope_theta: a keyword LlamaConfig takes (into its rope parameters) but does not list in its signature
    rope: dict[str, Any] = {
        "rope_theta": getattr(tc, "rope_theta", None) or tc.rope_parameters.get("rope_theta", 10000.0)
    }
    cfg = LlamaConfig(
        vocab_size=tc.vocab_size,
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        head_dim=head_dim,
        max_position_embeddings=tc.max_position_embeddings,
        **rope,
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
        cast(torch.nn.Embedding, student.get_input_embeddings()).weight.data.copy_(proj)
        # At init the residual stream is mostly the input token's own embedding, so with a unit final
        # norm the student would predict "repeat the input" with logits ~sqrt(d)*|e|. Scale the final
        # norm so that this self-logit is ~4 (unrelated tokens get std ~4/sqrt(d)): a near-uniform start.
        student.model.norm.weight.data.fill_(4.0 / (hidden_size**0.5 * float(proj.norm(dim=1).mean())))
    student.tie_weights()
    return student


def data_engine(engine: str, target) -> str:
    """``data.engine``: ``auto`` is ``packed`` where the target runs on the engine's bf16 CPU kernels (many
    sequences per weight stream through the batch-1 kernels), else ``batched`` (transformers, e.g. a GPU)."""
    if engine == "auto":
        return "packed" if model_kernel_path(target).startswith("bf16-avx") else "batched"
    if engine not in ("batched", "packed"):
        raise ValueError(f"data.engine must be auto, batched or packed, not {engine!r}")
    return engine


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
    """Median ms of one batch-1 single-token step with a KV cache after a ``context``-token prompt (the engine's
    path)."""
    generator = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, model.get_input_embeddings().weight.shape[0], (context,), generator=generator).tolist()
    return 1e3 * step_times(model, prompt, 1, next(model.parameters()).device, reps=reps)[0]


def cost_figures(target, draft_dir: Path) -> dict[str, Any]:
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


# what a manifest's generation settings must agree on with the run that trains on its shards: the chat mix's
# train split (and so the held-out chat conversations kept apart from it) is a function of these
MANIFEST_KEYS = {
    "prompts": "data.prompts",
    "n_prompts": "data.n_prompts",
    "seed": "seed",
    "multi_turn": "data.multi_turn",
}


def check_teacher_dir(data_dir: Path, cfg) -> dict:
    """``data.teacher_dir`` is whole (``shards.check_folder``: its manifest, every shard it lists and no other, their
    SHA-256 and records) and its generation settings are this run's, before any model loads. Returns the manifest."""
    if not data_dir.is_dir():
        raise TeacherDataError(
            f"data.teacher_dir={data_dir}: no such folder (unpack the bundles a GPU node returned: "
            "bash jobs/teacher_back.sh <bundles>)"
        )
    manifest = check_folder(data_dir)
    made = manifest["settings"]
    mine = {
        "prompts": cfg.data.get("prompts", "instructions"),
        "n_prompts": cfg.data.n_prompts,
        "seed": cfg.seed,
        "multi_turn": cfg.data.get("multi_turn", 0.4),
    }
    lacking = [k for k in MANIFEST_KEYS if k not in made]
    if lacking:
        raise TeacherDataError(f"data.teacher_dir={data_dir}: its manifest lacks {lacking}: generate it again")
    wrong = [f"{key}={made[k]}" for k, key in MANIFEST_KEYS.items() if made[k] != mine[k]]
    if wrong:
        raise TeacherDataError(
            f"data.teacher_dir={data_dir} was generated with other settings: add {' '.join(wrong)} "
            "(the held-out chat set is kept apart from the training split those settings make)"
        )
    return manifest


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
    teacher_dir = d.get("teacher_dir")
    made = check_teacher_dir(repo_path(teacher_dir), cfg) if teacher_dir else {}
    settings = teacher_settings(
        cast(dict, OmegaConf.to_container(d, resolve=True)), seed=cfg.seed, prompts=kind
    )  # before loading

    pair_cfg = cast(dict, OmegaConf.to_container(cfg.pair, resolve=True))
    pair_cfg["draft"] = None  # the draft is what we are making
    pair_cfg.pop("drafter", None)
    pair = load_pair(pair_cfg)
    target, tok = pair.target.eval(), pair.tokenizer  # the teacher in the pair's precision (the one that serves)
    pad_id = padding_id(tok)
    vocab = int(target.config.vocab_size)
    if teacher_dir and made["settings"].get("vocab_size") != vocab:
        raise TeacherDataError(
            f"data.teacher_dir={teacher_dir} was generated for a vocabulary of {made['settings'].get('vocab_size')} "
            f"ids, this target has {vocab}: generate it with this pair's target"
        )
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

    # 2. teacher data (or shards generated elsewhere, e.g. on a GPU node: data.teacher_dir)
    if teacher_dir:
        data_dir = repo_path(teacher_dir)
        log(f"teacher data: the shards of {data_dir} (no generation here)")
    t0 = time.time()
    if not teacher_dir:
        generate_teacher_data(target, tok, data_dir, **{**settings, "engine": engine}, log=log)
    new_gen_s = time.time() - t0
    if teacher_dir:  # the generation's wall time is the manifest's (the node's)
        new_gen_s, wall = 0.0, float(made.get("wall_s", 0.0))
    else:
        stamp = data_dir / "wall_s.json"
        wall = json.loads(stamp.read_text())["wall_s"] if stamp.exists() else 0.0
        stamp.write_text(json.dumps({"wall_s": wall + new_gen_s}))
    if cfg.get("stop_after") == "data":
        log("stop_after=data: teacher data and held-out sets written, no training")
        return {}
    records = load_records(data_dir, vocab)  # every record checked (ids inside the vocabulary, log-probs <= 0)
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
            **cast(dict, OmegaConf.to_container(s)),
            "vocab_size": target.config.vocab_size,
            "params": n_params,
            "bytes": size,
            "map_size": int(token_map.numel()),
        },
        "data": {
            **cast(dict, OmegaConf.to_container(d)),
            "engine_used": engine,
            "records": len(records),
            "tokens": n_tok,
            "gen_records": sum(r["kind"] == "gen" for r in records),
            "gen2_records": sum(r["kind"] == "gen2" for r in records),
            "tf_records": sum(r["kind"] == "tf" for r in records),
            "wall_s": wall + new_gen_s,
            "map_coverage": cov / tot,
        },
        "train": {**cast(dict, OmegaConf.to_container(tr)), "wall_s": train_wall},
        "heldout": {
            **cast(dict, OmegaConf.to_container(h)),
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
