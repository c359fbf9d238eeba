"""What the loop's phase clock costs: its transitions per token x the cost of one transition, against a token's time.

    HF_HUB_OFFLINE=1 python benchmarks/phase_clock_cost.py [--methods ar spd mtad] [--tokens 64]

1. One transition (``PhaseClock.enter`` to a new phase, as the loop calls it; ``end_iteration`` too): the fastest
   of 7 rounds of 200,000 calls (the fastest round is the one the machine least disturbed).
2. Per method, one decode on the default pair (``smollm2-offline``) at batch 1: the clock's transitions over the
   window (``PhaseClock.transitions``) per emitted token, and the window's milliseconds per token by the same clock.
3. The clock's share of a token: transitions per token x one transition / ms per token (the figure the issue bounds
   at 1%).
"""

from __future__ import annotations

import argparse
import time

from pipeline.decoding import build_decoder, make_generator
from pipeline.decoding.batched import BatchedDecoder
from pipeline.decoding.phase_clock import PhaseClock
from pipeline.models import load_pair, pair_config
from pipeline.prompts import encode_prompt, eos_ids


def transition_seconds(calls: int = 200_000, rounds: int = 7) -> tuple[float, float]:
    """(seconds per ``enter``, seconds per ``end_iteration``): the fastest round of ``rounds``."""
    best_enter = best_end = float("inf")
    for _ in range(rounds):
        clock = PhaseClock()
        clock.start()
        t0 = time.perf_counter()
        for i in range(calls // 2):
            clock.enter("draft")
            clock.enter("verify")
        best_enter = min(best_enter, (time.perf_counter() - t0) / calls)
        clock = PhaseClock()
        clock.start()
        n = calls // 10
        t0 = time.perf_counter()
        for _ in range(n):
            clock.end_iteration(rows=5, positions=4, drafted=4, emitted=3, context=100, requests=1)
        best_end = min(best_end, (time.perf_counter() - t0) / n)
    return best_enter, best_end


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--methods", nargs="+", default=["ar", "spd", "mtad"])
    parser.add_argument("--tokens", type=int, default=64)
    args = parser.parse_args()
    enter_s, end_s = transition_seconds()
    print(f"one transition: enter {1e9 * enter_s:.0f} ns, end_iteration {1e9 * end_s:.0f} ns")
    pair = load_pair(pair_config("smollm2-offline"))
    prompt = encode_prompt(pair.tokenizer, "Write a Python function that returns the n-th Fibonacci number.", True)
    eos = eos_ids(pair.tokenizer, pair.target)
    for method in args.methods:
        dec = build_decoder(method, pair.target, pair.draft if method != "ar" else None, assets=pair.assets)
        engine = BatchedDecoder(dec, 1)
        engine.generate([prompt], max_new_tokens=8, eos_token_ids=eos, generators=[make_generator(0)])  # warm
        engine.clock.reset()
        (gen,) = engine.generate([prompt], max_new_tokens=args.tokens, eos_token_ids=[], generators=[make_generator(1)])
        its = engine.clock.records()
        tokens = len(gen.tokens)
        wall = sum(it.wall_s for it in its)
        per_token = engine.clock.transitions / tokens
        share = per_token * max(enter_s, end_s) / (wall / tokens)
        print(
            f"{method}: {tokens} tokens, {len(its)} iterations, {1e3 * wall / tokens:.2f} ms/token, "
            f"{per_token:.1f} transitions/token -> the clock's share of a token {100 * share:.3f}%"
        )


if __name__ == "__main__":
    main()
