"""Tokens/s of decoding methods with a pair's draft on held-out prompts (the figures of a draft's model card).

    python -m pipeline.distill_speed --pair smollm2-offline --repeats 3  # --methods: the bench's (conf/bench.yaml)

Held-out prompts: HumanEval and MT-Bench first turns (the ones the distilled draft never saw). Each
repeat runs every method once over the same prompts and seeds (methods interleaved, so load from
other processes on a shared machine hits them alike); the figure is tokens / wall time of the repeat,
and the speedup is the median over repeats of (method tokens/s) / (ar tokens/s of the same repeat).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import torch
import yaml

from pipeline.decoding import build_decoder, make_generator, method_class
from pipeline.decoding.vocab import restrict_head
from pipeline.models import load_pair, pair_config
from pipeline.prompts import chat_ids
from pipeline.training.cards import append_to_card
from pipeline.training.common import repo_path
from pipeline.training.distill_heldout import heldout_prompts


def bench_methods() -> list[str]:
    """The methods timed by default: the bench's (``methods:`` of conf/bench.yaml), the one default list of methods
    to time."""
    return list(yaml.safe_load(repo_path("conf/bench.yaml").read_text())["methods"])


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line, checked before any model loads: ``--methods`` defaults to ``bench_methods()``, and a name
    that is not a registered method (or `module:attr` of one) exits 2 naming the registered ones."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pair", default="smollm2-offline")
    ap.add_argument(
        "--methods", nargs="+", default=None, help="registered methods to time (default: the bench's, conf/bench.yaml)"
    )
    ap.add_argument("--gamma", type=int, default=4, help="the draft length of every method that takes one")
    ap.add_argument("--n-humaneval", type=int, default=4)
    ap.add_argument("--n-mtbench", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--full-head", action="store_true", help="use the draft's full tied head (no restriction)")
    ap.add_argument("--out", default=None, help="write the figures as JSON here")
    ap.add_argument(
        "--mt-bench",
        default=None,
        help="MT-Bench question.jsonl for the held-out prompts (default: $PIPELINE_DATA_ROOT or the project's data/, "
        "then mt_bench/question.jsonl, relative to the repository root)",
    )
    ap.add_argument(
        "--card", default=None, help="a draft directory: append the figures to its MODEL_CARD.md and metrics.json"
    )
    args = ap.parse_args(argv)
    args.methods = args.methods or bench_methods()
    for m in args.methods:
        try:
            method_class(m)  # an unknown name fails here, before the pair loads, with the registered names
        except ValueError as err:
            ap.error(f"--methods: {err}")
    return args


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    config = pair_config(args.pair)
    if args.full_head and config.get("draft"):
        config["draft"] = {**config["draft"], "restrict_head": False}
    pair = load_pair(config)
    draft = pair.draft
    if draft is not None and not args.full_head and getattr(draft, "draft_token_map", None) is None:
        draft = restrict_head(draft)  # no-op without restricted_head_map.json; the engine reads draft_token_map
    tok = pair.tokenizer
    mt_bench = args.mt_bench
    if mt_bench is None and args.n_mtbench:
        mt_bench = str(repo_path(os.environ.get("PIPELINE_DATA_ROOT", "data")) / "mt_bench" / "question.jsonl")
    prompts = heldout_prompts(args.n_humaneval, args.n_mtbench, mt_bench)
    prompt_ids = [chat_ids(tok, p) for p in prompts]
    eos = [tok.eos_token_id]
    # every method that takes a draft length runs at --gamma; a method builds its draft model only if it needs one
    decoders = {
        m: build_decoder(m, pair.target, draft, **({"gamma": args.gamma} if "gamma" in method_class(m).params else {}))
        for m in args.methods
    }
    with torch.no_grad():  # warm-up
        for m, dec in decoders.items():
            dec.generate(prompt_ids[0], max_new_tokens=8, eos_token_ids=eos, generator=make_generator(0))
    runs: dict[str, list[dict]] = {m: [] for m in args.methods}
    for r in range(args.repeats):
        for m, dec in decoders.items():
            n_tok = steps = drafts = 0
            acc = []
            t = time.perf_counter()
            with torch.no_grad():
                for i, ids in enumerate(prompt_ids):
                    g = dec.generate(
                        ids,
                        max_new_tokens=args.max_new_tokens,
                        eos_token_ids=eos,
                        generator=make_generator(args.seed * 1000 + i),
                    )
                    n_tok += len(g.tokens)
                    steps += g.steps
                    drafts += g.draft_steps
                    acc += g.accepted
            dt = time.perf_counter() - t
            runs[m].append(
                {
                    "tokens": n_tok,
                    "seconds": dt,
                    "tokens_per_s": n_tok / dt,
                    "target_steps": steps,
                    "draft_steps": drafts,
                    "tokens_per_step": n_tok / max(steps, 1),
                }
            )
            print(
                (
                    f"repeat {r} {m:6s} {n_tok / dt:7.2f} tok/s  {n_tok} tokens  {n_tok / max(steps, 1):.2f} "
                    "tokens/target step"
                ),
                flush=True,
            )
    summary = {}
    for m in args.methods:
        tps = [x["tokens_per_s"] for x in runs[m]]
        summary[m] = {
            "tokens_per_s_median": statistics.median(tps),
            "tokens_per_s": tps,
            "tokens_per_step": statistics.median(x["tokens_per_step"] for x in runs[m]),
        }
        if "ar" in runs and m != "ar":
            ratios = [a["tokens_per_s"] / b["tokens_per_s"] for a, b in zip(runs[m], runs["ar"])]
            summary[m]["speedup_vs_ar_median"] = statistics.median(ratios)
            summary[m]["speedup_vs_ar"] = ratios
    result = {"args": vars(args), "summary": summary, "runs": runs}
    print(json.dumps(summary, indent=2))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2))
    if args.card:
        append_to_card(Path(args.card), result, argv)
    return result
