"""Perplexity of generated tokens under the unwarped target, token-weighted over a slice.

One teacher-forced target pass over prompt + generated ids per sample, after the measurement window;
the NLL of each generated token (EOS included) under ``log_softmax`` of the raw logits in fp32 (no
temperature, top-k or top-p). Where the engine serves the target on its bf16 CPU kernels, the pass is the
engine's (``CachedModel``): the rows the decoders drew from, bit for bit (the kernels are batch-invariant), at the
kernels' cost per token; transformers' bf16 forward goes through oneDNN, slow on a CPU without AVX512-BF16 (the
stage took 21 s of a smoke cell there: benchmarks/notes-cpu-bench-history.md). Elsewhere transformers' forward.
The slice's perplexity is ``exp(sum NLL / sum tokens)``, so long answers weigh in proportion to their length;
the per-sample figures come along.

Re-scoring saved generations: ``python -m pipeline.scoring.perplexity --pair NAME --predictions FILE``
where each record holds ``prompt_ids`` and ``tokens`` (what ``pipeline.measure.window`` writes); records with
only text (``prompt``/``prompt_text`` and ``prediction``) are re-tokenised, which is flagged because
re-tokenisation need not reproduce the generated ids.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import torch

from pipeline import models
from pipeline.decoding.fast_forward import lean_forward_for
from pipeline.decoding.kv import CachedModel
from pipeline.scoring import print_json, run_cli


def target_rows(model: Any, ids: torch.Tensor) -> torch.Tensor:
    """The logits of every position of ``ids`` [1, T]: ``[T, V]``, through the engine's bf16 CPU kernels where they
    serve ``model`` (a fresh cache; fp32 rows), else transformers' forward."""
    lean = lean_forward_for(model)
    if lean is not None and lean.kernel_path.startswith("bf16-"):
        return CachedModel(model).forward(ids[0], keep=0)
    return model(input_ids=ids).logits[0]


@torch.inference_mode()
def sequence_nll(
    model: Any, prompt_ids: Sequence[int], generated_ids: Sequence[int], chunk: int = 1024
) -> tuple[float, int]:
    """Sum of NLL (nats) of ``generated_ids`` given ``prompt_ids`` under ``model``, and their count."""
    if not generated_ids:
        return 0.0, 0
    if not prompt_ids:
        raise ValueError("a prompt of at least one token is needed to score the first generated token")
    device = next(model.parameters()).device
    ids = torch.tensor([list(prompt_ids) + list(generated_ids)], device=device)
    logits = target_rows(model, ids)  # [T, V]
    start = len(prompt_ids) - 1  # logits at position t predict token t + 1
    targets = ids[0, len(prompt_ids) :]
    total = 0.0
    for lo in range(0, targets.numel(), chunk):  # bounded fp32 memory for long answers
        rows = logits[start + lo : start + lo + chunk].float()
        logp = torch.log_softmax(rows, dim=-1)
        total -= logp.gather(-1, targets[lo : lo + chunk, None]).sum().item()
    return total, int(targets.numel())


def perplexity(model: Any, pairs: Iterable[tuple[Sequence[int], Sequence[int]]]) -> dict[str, Any]:
    """Token-weighted perplexity over ``(prompt_ids, generated_ids)`` pairs, with per-sample figures."""
    per_sample = []
    nll_sum, count = 0.0, 0
    for prompt_ids, gen_ids in pairs:
        nll, n = sequence_nll(model, prompt_ids, gen_ids)
        nll_sum += nll
        count += n
        per_sample.append({"nll": nll, "tokens": n, "perplexity": math.exp(nll / n) if n else float("nan")})
    return {
        "metric": "perplexity",
        "score": math.exp(nll_sum / count) if count else float("nan"),
        "nll_sum": nll_sum,
        "tokens": count,
        "per_sample": per_sample,
    }


def pairs_from_records(
    records: Sequence[Mapping[str, Any]], tokenizer: Any = None
) -> tuple[list[tuple[list[int], list[int]]], bool]:
    """``(prompt_ids, tokens)`` of saved records; re-tokenises text-only records (flagged)."""
    pairs, retokenised = [], False
    for rec in records:
        if "prompt_ids" in rec and "tokens" in rec:
            pairs.append((list(rec["prompt_ids"]), list(rec["tokens"])))
            continue
        if tokenizer is None:
            raise ValueError(f"record {rec.get('id')!r} has no prompt_ids/tokens and no tokenizer was given")
        prompt = rec.get("prompt_text", rec.get("prompt"))
        if prompt is None or rec.get("prediction") is None:
            raise ValueError(f"record {rec.get('id')!r} needs prompt_ids + tokens, or prompt text + prediction")
        pairs.append(
            (
                tokenizer(prompt, add_special_tokens=False)["input_ids"],
                tokenizer(rec["prediction"], add_special_tokens=False)["input_ids"],
            )
        )
        retokenised = True
    return pairs, retokenised


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--pair", required=True, help="pair whose target scores the generations (conf/pair/<name>.yaml)"
    )
    parser.add_argument("--predictions", required=True, help="JSONL records with prompt_ids + tokens (or text)")
    parser.add_argument("--data", default=None, help="unused: accepted for the scorers' common command line")
    parser.add_argument("--device", default="auto")
    args = parser.parse_args(argv)
    records = [json.loads(l) for l in Path(args.predictions).read_text().splitlines() if l.strip()]
    cfg = models.pair_config(args.pair)
    spec = models.ModelSpec.from_config(cfg["target"])
    tokenizer = models.load_tokenizer(spec)
    model = models.load_model(spec, cfg.get("dtype", "float32"), args.device)
    pairs, retokenised = pairs_from_records(records, tokenizer)
    result = perplexity(model, pairs)
    result["retokenised"] = retokenised
    result["model"] = spec.id
    for rec, detail in zip(records, result["per_sample"]):
        detail["id"] = str(rec.get("id"))
    print_json(result)
    return 0


if __name__ == "__main__":
    raise SystemExit(run_cli(main))
