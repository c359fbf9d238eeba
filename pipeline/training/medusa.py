"""Train Medusa heads for a pair's target with its backbone frozen (Medusa-1).

    python -m pipeline.train_medusa pair=smollm2-offline            # -> models/smollm2-135m-medusa/

Data (built here, offline, from nothing that is evaluated: no HumanEval, MT-Bench, Spider or
Spec-Bench prompt is ever used):

- Python standard-library source from the running interpreter, shown as chat answers to a
  "show me the code of <file>" request (teacher-forced text);
- the target's own sampled answers (T=1, top-k 10, top-p 0.9) to instruction prompts written
  below (self-distillation: the contexts the heads meet when decoding for this target).

Held-out text comes from other stdlib files and other prompts. The target's last hidden states
(the input of its LM head) are computed once; each head is ``ResBlock^L`` followed by the target's
own tied LM head (shared, frozen, never saved), trained with ``sum_i 0.8^(i-1) CE(head_i(h_t),
y_{t+i+1})`` over the full vocabulary. The output folder gets ``medusa_config.json`` (architecture,
data sizes, held-out top-1 accuracy of every head, the command) and ``medusa_heads.safetensors``.
"""

from __future__ import annotations

import math
import random
import sysconfig
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from pipeline.decoding.medusa_heads import MedusaHeads, save_medusa_heads
from pipeline.models import REPO_ROOT, PairSpec, load_model, load_tokenizer
from pipeline.prompts import chat_ids

TOPICS = [
    "tides", "glaciers", "the printing of books", "solar panels", "bicycles", "typography", "origami",
    "the immune response", "beekeeping", "lighthouses", "sourdough", "submarines", "compilers",
    "hash tables", "version control", "unit testing", "regular expressions", "spreadsheets",
    "bird migration", "rainbows", "thunderstorms", "fermentation", "caves", "deserts", "satellites",
    "libraries", "maps", "clocks", "trains", "bridges", "recycling paper", "word processors",
]
INSTRUCTIONS = [
    "Explain {t} to a curious teenager.",
    "Give three interesting facts about {t}.",
    "Write a short paragraph about the history of {t}.",
    "What are the pros and cons of {t}?",
    "Write a haiku and then a short explanation about {t}.",
    "Summarize how {t} works in a few sentences.",
]
CODE_TASKS = [
    "counts the vowels in a string", "merges two sorted lists", "computes a moving average",
    "parses a date in YYYY-MM-DD format", "flattens a nested list", "checks whether a year is a leap year",
    "converts Celsius to Fahrenheit for a list of values", "removes duplicate lines from a text file",
    "finds the most common word in a paragraph", "validates a simple email address",
    "computes the greatest common divisor of two numbers", "transposes a matrix given as a list of lists",
]
CODE_TEMPLATES = [
    "Write a Python function that {t}. Add a docstring.",
    "Show a small Python program that {t}, with comments.",
]


def build_prompts(seed: int) -> tuple[list[str], list[str]]:
    """(training prompts, held-out prompts): disjoint topics/tasks, written here."""
    rng = random.Random(seed)
    prose = [i.format(t=t) for t in TOPICS for i in INSTRUCTIONS]
    code = [c.format(t=t) for t in CODE_TASKS for c in CODE_TEMPLATES]
    rng.shuffle(prose)
    rng.shuffle(code)
    held = prose[:12] + code[:4]
    train = prose[12:] + code[4:]
    held_topics = {p for p in held}
    return [p for p in train if p not in held_topics], held


def stdlib_chunks(n_files_train: int, n_files_heldout: int, max_chars: int, seed: int) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """(train, held-out) lists of (relative path, source chunk) from different stdlib files."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(
        p for p in root.rglob("*.py")
        if "test" not in p.parts and "tests" not in p.parts and "site-packages" not in p.parts
        and "idlelib" not in p.parts and p.stat().st_size > 2000
    )
    rng = random.Random(seed)
    rng.shuffle(files)

    def take(sel):
        out = []
        for p in sel:
            text = p.read_text(errors="ignore")
            start = rng.randrange(0, max(1, len(text) - max_chars))
            out.append((str(p.relative_to(root)), text[start : start + max_chars]))
        return out

    return take(files[:n_files_train]), take(files[n_files_train : n_files_train + n_files_heldout])


@torch.no_grad()
def sample_answers(model, tokenizer, prompts: list[str], max_new_tokens: int, batch_size: int, seed: int, log) -> list[list[int]]:
    """The target's sampled answers (prompt + answer ids), T=1 top-k 10 top-p 0.9, batched with left padding."""
    torch.manual_seed(seed)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    out = []
    for b in range(0, len(prompts), batch_size):
        batch = [chat_ids(tokenizer, p) for p in prompts[b : b + batch_size]]
        width = max(map(len, batch))
        ids = torch.tensor([[pad] * (width - len(x)) + x for x in batch])
        mask = torch.tensor([[0] * (width - len(x)) + [1] * len(x) for x in batch])
        gen = model.generate(
            input_ids=ids, attention_mask=mask, do_sample=True, temperature=1.0, top_k=10, top_p=0.9,
            max_new_tokens=max_new_tokens, pad_token_id=pad,
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
def head_accuracy(heads: MedusaHeads, lm_head, hidden: torch.Tensor, labels: torch.Tensor, chunk: int = 512) -> list[float]:
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
    heads: MedusaHeads, lm_head, hidden: torch.Tensor, labels: torch.Tensor, *, steps: int, batch_tokens: int,
    lr: float, warmup: int = 20, weight_decay: float = 0.0, decay: float = 0.8, vocab: torch.Tensor | None = None,
    seed: int = 0, deadline: float | None = None, log=print, log_every: int = 10, eval_every: int = 0, evaluate=None,
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
    gen = torch.Generator().manual_seed(seed)
    n = hidden.shape[0]
    heads.train()
    for step in range(1, steps + 1):
        if deadline is not None and time.time() > deadline:
            log(f"time budget reached at step {step}")
            break
        rate = lr * min(1.0, step / max(warmup, 1)) * 0.5 * (1 + math.cos(math.pi * step / steps))
        for group in opt.param_groups:
            group["lr"] = rate
        idx = torch.randint(0, n, (batch_tokens,), generator=gen)
        logits = heads.features(hidden[idx]) @ W.T  # [K, B, V']
        y = y_fit[idx]
        loss = sum(weights[i] * F.cross_entropy(logits[i], y[:, i + 1], ignore_index=-100) for i in range(k))
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


def feature_data(model, tokenizer, data_cfg: dict[str, Any], seed: int, cache: Path, log) -> dict[str, tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """The offline training/held-out text and the frozen target's last hidden states over it (cached in ``cache``).

    Tags ``train`` (stdlib source + the target's sampled answers), ``heldout_stdlib``, ``heldout_answers``;
    each ``(hidden [N, H], token ids [N], sequence ids [N])`` (``hidden_states``). Used by Medusa and EAGLE training.
    """
    if cache.exists():
        log(f"loaded cached data {cache}")
        return torch.load(cache)
    train_prompts, held_prompts = build_prompts(seed)
    train_prompts = train_prompts[: data_cfg["n_prompts"]]
    held_prompts = held_prompts[: data_cfg["n_heldout_prompts"]]
    src_train, src_held = stdlib_chunks(data_cfg["n_stdlib_files"], data_cfg["n_heldout_stdlib_files"], data_cfg["stdlib_chars"], seed)
    limit = data_cfg["max_len"]
    seqs_train = [chat_ids(tokenizer, f"Show me the code of {p}.", c)[:limit] for p, c in src_train]
    seqs_held = [chat_ids(tokenizer, f"Show me the code of {p}.", c)[:limit] for p, c in src_held]
    gen_train = sample_answers(model, tokenizer, train_prompts, data_cfg["max_new_tokens"], data_cfg["batch_size"], seed, log)
    gen_held = sample_answers(model, tokenizer, held_prompts, data_cfg["max_new_tokens"], data_cfg["batch_size"], seed + 1, log)
    data = {}
    for tag, seqs in (("train", seqs_train + gen_train), ("heldout_stdlib", seqs_held), ("heldout_answers", gen_held)):
        data[tag] = hidden_states(model, seqs, log, tag)
    torch.save(data, cache)
    log("data: " + ", ".join(f"{k} {v[0].shape[0]} tokens" for k, v in data.items()))
    return data


def run(cfg: dict[str, Any]) -> dict[str, Any]:
    torch.set_num_threads(int(cfg["threads"]))
    torch.manual_seed(cfg["seed"])
    work = Path(cfg["work_dir"])
    work.mkdir(parents=True, exist_ok=True)
    log_file = open(work / "train.log", "a")
    t0 = time.time()

    def log(msg: str) -> None:
        line = f"[{time.time() - t0:7.1f}s] {msg}"
        print(line, flush=True)
        log_file.write(line + "\n")
        log_file.flush()

    spec = PairSpec.from_config(cfg["pair"])
    model = load_model(spec.target, "float32", "cpu").requires_grad_(False)
    tokenizer = load_tokenizer(spec.target)
    lm_head = model.get_output_embeddings()

    data = feature_data(model, tokenizer, cfg["data"], cfg["seed"], work / "data.pt", log)

    k = cfg["heads"]["num_heads"]
    heads = MedusaHeads(model.config.hidden_size, k, cfg["heads"]["num_layers"])
    h_train, ids_train, seq_train = data["train"]
    y_train = head_examples(ids_train, seq_train, k)
    held = {tag: (data[tag][0], head_examples(data[tag][1], data[tag][2], k)) for tag in ("heldout_stdlib", "heldout_answers")}

    tc = cfg["train"]
    vocab = None
    if tc["vocab"] == "corpus":
        vocab = torch.unique(torch.cat([ids_train] + [data[t][1] for t in held]))
        log(f"training softmax over {vocab.numel()} corpus tokens")

    def evaluate(step: int) -> None:
        for tag, (h, lab) in held.items():
            log(f"step {step} held-out top-1 [{tag}] " + " ".join(f"{a:.3f}" for a in head_accuracy(heads, lm_head, h, lab)))

    train_heads(
        heads, lm_head, h_train, y_train, steps=tc["steps"], batch_tokens=tc["batch_tokens"], lr=tc["lr"],
        warmup=tc["warmup"], weight_decay=tc["weight_decay"], decay=tc["decay"], vocab=vocab, seed=cfg["seed"],
        deadline=t0 + tc["time_budget_s"], log=log, log_every=tc["log_every"],
        eval_every=tc["eval_every"], evaluate=evaluate,
    )
    n = h_train.shape[0]

    accuracy = {}
    for tag, (h, lab) in held.items():
        acc = head_accuracy(heads, lm_head, h, lab)
        accuracy[tag] = {"lm_head": round(acc[0], 4), **{f"head_{i}": round(a, 4) for i, a in enumerate(acc[1:], 1)}}
        log(f"final held-out top-1 [{tag}] ({h.shape[0]} tokens): {accuracy[tag]}")
    out_dir = Path(cfg["out_dir"])
    if not out_dir.is_absolute():
        out_dir = REPO_ROOT / out_dir
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
        "minutes": round((time.time() - t0) / 60, 1),
    }
    save_medusa_heads(heads, out_dir, **info)
    log(f"saved heads to {out_dir}")
    return info
