"""Leviathan et al.'s speculative-decoding arithmetic (2023, section 3): the one implementation.

- ``expected_tokens(alpha, gamma)``: E[tokens per step] = (1 - alpha^(gamma+1)) / (1 - alpha) for an
  i.i.d. per-token acceptance rate alpha and gamma drafted tokens;
- ``leviathan_bound(alpha, gamma, c)``: the ideal improvement factor E[tokens] / (gamma c + 1), with
  c = t_draft / t_target;
- ``alpha_from_accepted``: the MLE of alpha from tokens emitted per step (token verification);
- ``alpha_from_tokens_per_step``: the alpha whose expected tokens per step equals a measured mean;
- ``predicted_speedup``: what recorded iterations give on a memory-bound accelerator with a compute roof
  (``GPU_ROOF_ROWS``), and ``predicted_serving``: the same served under load, each method at the occupancy its own
  speed brings at an offered rate (Little's law, ``served_occupancy``), and the rate at which speculation stops paying.

Used by the benchmark (``pipeline.bench``), the acceptance metrics (``pipeline.measure.acceptance``) and the
analysis (``analysis.stats``).
"""

from __future__ import annotations

import math
from typing import Iterable

import numpy as np
from scipy.optimize import brentq


def expected_tokens(alpha: float, gamma: int) -> float:
    """E[tokens per step] = (1 - alpha^(gamma+1)) / (1 - alpha) for i.i.d. acceptance rate alpha."""
    if alpha >= 1.0:
        return float(gamma + 1)
    return (1.0 - alpha ** (gamma + 1)) / (1.0 - alpha)


def leviathan_bound(alpha: float, gamma: int, c: float) -> float:
    """Leviathan et al.'s speedup bound (1 - a^(g+1)) / ((1 - a)(g c + 1)); NaN where an input is missing."""
    if any(v is None or not math.isfinite(float(v)) for v in (alpha, gamma, c)):
        return math.nan
    return expected_tokens(alpha, int(gamma)) / (gamma * c + 1.0)


def alpha_from_accepted(accepted: Iterable[int], gamma: int) -> float:
    """MLE of the per-token acceptance rate from tokens emitted per step (token verification).

    A step that emitted n + 1 tokens examined min(n + 1, gamma) drafts and accepted n of them.
    """
    acc = examined = 0
    for emitted in accepted:
        n = emitted - 1
        acc += n
        examined += min(n + 1, gamma)
    return acc / examined if examined else 0.0


def alpha_from_tokens_per_step(tokens_per_step: float, gamma: int) -> float:
    """The alpha in [0, 1] whose expected tokens/step equals the measured one (bisection on a monotone map).

    Values outside [1, gamma + 1] are clipped to alpha 0 or 1; NaN in, NaN out.
    """
    if tokens_per_step is None or not math.isfinite(tokens_per_step) or gamma is None or gamma < 1:
        return math.nan
    if tokens_per_step <= 1.0:
        return 0.0
    if tokens_per_step >= gamma + 1:
        return 1.0
    return float(brentq(lambda a: expected_tokens(a, gamma) - tokens_per_step, 0.0, 1.0 - 1e-15, xtol=1e-12))


def hindsight_bound(iterations: Iterable[tuple[int, int]], gamma: int, c: float, v: float = 0.0) -> float:
    """The ideal speedup a fixed draft length ``gamma`` would have had on these recorded iterations: mean tokens per
    step over (drafted g, drafts accepted n) pairs, each counted as min(n, gamma) + 1, over (gamma (c + v) + 1), with
    ``v`` what each verified draft adds to the target's pass as a share of a step (0: one step, Leviathan).

    The assumption (``hindsight_gamma``): a shorter chain is a prefix of the recorded one and its drafts meet the
    same verdicts (token verification of prefix drafts), so a chain of gamma <= g accepts min(n, gamma); for gamma > g
    the recorded n is kept (conservative: a chain that passed whole might have gone on). Plain steps (g = 0) are
    left out."""
    used = [(g, n) for g, n in iterations if g > 0]
    if not used:
        return math.nan
    tokens = sum(min(n, gamma) + 1 for _, n in used) / len(used)
    return tokens / (gamma * (c + v) + 1.0)


def hindsight_gamma(
    iterations: Iterable[tuple[int, int]], gamma_max: int, c: float, v: float = 0.0
) -> tuple[int, float]:
    """The best fixed draft length in hindsight for one request (1..``gamma_max``, the length it was recorded at)
    and its ``hindsight_bound`` (ties: the shorter); (0, NaN) without a drafted iteration."""
    used = list(iterations)
    best = max(range(1, gamma_max + 1), key=lambda g: (hindsight_bound(used, g, c, v), -g))
    bound = hindsight_bound(used, best, c, v)
    return (0, math.nan) if math.isnan(bound) else (best, bound)


# ----------------------------------------------------------------------------------- predicted for another machine


# A100 (bf16): 312 TFLOP/s over 2.04 TB/s = 153 FLOP per byte; a decode step streams each bf16 weight (2 bytes) once and
# does 2 FLOP per weight per row, so its compute equals its memory time at 153 rows: the accelerator's compute roof in
# rows (H100 SXM: 989 / 3.35 = 295; L40S: 362 / 0.864 = 419). predicted_speedup adds rows / roof to a step's time.
GPU_ROOF_ROWS = 153.0


def pass_cost(rows: float, batch: int = 1, roof_rows: float = math.inf) -> float:
    """A target pass over ``rows`` rows per request at ``batch`` requests, in units of a plain step at that batch
    (``batch`` rows), on a machine whose weights' streaming costs one step and each row ``1 / roof_rows`` of it
    more (the roofline's two terms added: memory, then compute). ``roof_rows`` inf: memory-bound, every pass 1."""
    if not math.isfinite(roof_rows):
        return 1.0
    return (1.0 + batch * rows / roof_rows) / (1.0 + batch / roof_rows)


def predicted_speedup(
    iterations: Iterable[tuple[int, int]],
    c: float,
    v: float = 0.0,
    *,
    batch: int = 1,
    roof_rows: float = math.inf,
) -> float:
    """The speedup over ar that these recorded iterations would have on a machine where a draft token costs ``c``
    target steps and each verified draft adds ``v`` of a step to the pass (v = 0: memory-bound, Leviathan's model):
    tokens emitted over the iterations' cost, sum(e_i) / sum(g_i (c + v) + 1), over (drafted g_i, emitted e_i) pairs,
    the bonus token included in e_i (a plain step, g = 0, costs one step and emits one token, as ar does). The
    same arithmetic as ``leviathan_bound`` (at i.i.d. acceptance and a fixed gamma its expectation is
    E[tokens] / (gamma c + 1)) and ``hindsight_bound`` at the recorded lengths; NaN without an iteration. With a
    compute roof (``roof_rows``, e.g. ``GPU_ROOF_ROWS``) at ``batch`` requests the pass of g + 1 rows per request costs
    ``pass_cost(g + 1, batch, roof_rows)`` plain steps instead of 1: speculation's gain shrinks as the batch's rows
    approach the roof, the batch effect the memory-bound model (v = 0) cannot show."""
    tokens = cost = 0.0
    for g, emitted in iterations:
        tokens += emitted
        cost += g * (c + v) + pass_cost(g + 1, batch, roof_rows)
    return tokens / cost if cost > 0 else math.nan


# A100 SXM's HBM bandwidth, bytes/s: with GPU_ROOF_ROWS the other half of the same roofline (312 TFLOP/s / 2.04 TB/s)
GPU_BANDWIDTH_B_S = 2.04e12


def step_seconds(parameters: float, bytes_per_parameter: float = 2.0, bandwidth: float = GPU_BANDWIDTH_B_S) -> float:
    """A plain decoding step's time on a memory-bound accelerator: the weights it reads (``step_parameters``) times
    their bytes (bf16: 2) over the memory bandwidth (A100's by default). KV-cache reads and launch overheads are left
    out: a lower bound, the scale of ``predicted_serving``'s rates."""
    return float(parameters) * float(bytes_per_parameter) / float(bandwidth)


def per_token_cost(tokens: float, drafted: float, c: float, roof_rows: float = GPU_ROOF_ROWS) -> tuple[float, float]:
    """(a, k): a request's time per emitted token at ``b`` requests in the batch is ``step * (a + k b)`` on a
    memory-bound accelerator with a compute roof: an iteration streams the draft's weights ``drafted`` times (``c``
    each) and the target's once (1), and its ``drafted + 1`` rows per request add ``b (drafted + 1) / roof_rows``;
    ``tokens`` emitted per request and iteration. ar: ``per_token_cost(1, 0, 0)`` = (1, 1 / roof_rows)."""
    return (drafted * c + 1.0) / tokens, (drafted + 1.0) / (tokens * roof_rows)


def served_occupancy(rate: float, new_tokens: float, step: float, cost: tuple[float, float], slots: float) -> float:
    """The mean number of requests in the batch at ``rate`` requests/s, each emitting ``new_tokens`` at
    ``step * (a + k b)`` seconds a token (``per_token_cost``) with b the batch it sees: itself and the L others that
    Poisson arrivals find there on average (``served_batch``). Little's law, L = rate x new_tokens x that time, solved
    for L: ``rate n step (a + k) / (1 - rate n step k)``, with b capped at ``slots`` (the engine's, ``inf``: unbounded);
    at or past the capacity the batch is full and the queue grows without bound: ``slots``. Prefill is left out."""
    a, k = cost
    load = rate * new_tokens * step
    if load * k >= 1.0:
        return float(slots)
    occupancy = load * (a + k) / (1.0 - load * k)
    if occupancy + 1.0 > slots:  # the batch a request sees is full: its time is the full batch's
        occupancy = load * (a + k * slots)
    return float(min(occupancy, slots))


def served_batch(rate: float, new_tokens: float, step: float, cost: tuple[float, float], slots: float) -> float:
    """The batch a request is decoded in at ``rate``: itself and the others in service (``served_occupancy``),
    at most ``slots``."""
    return float(min(1.0 + served_occupancy(rate, new_tokens, step, cost, slots), slots))


def served_tpot(rate: float, new_tokens: float, step: float, cost: tuple[float, float], slots: float) -> float:
    """Seconds per output token of a request at ``rate``: ``step * (a + k b)``, b its batch (``served_batch``)."""
    a, k = cost
    return step * (a + k * served_batch(rate, new_tokens, step, cost, slots))


def predicted_serving(
    tokens: float,
    drafted: float,
    c: float,
    new_tokens: float,
    step: float,
    slots: float = math.inf,
    roof_rows: float = GPU_ROOF_ROWS,
) -> dict[str, float]:
    """Where speculation stops paying under load on a memory-bound accelerator with a compute roof, from what a cell
    measured: ``tokens`` emitted per request and iteration and ``drafted`` positions per iteration (the in-loop
    acceptance), ``c`` (a draft position's weights over the target step's), ``new_tokens`` per request, ``step``
    (``step_seconds``) and the engine's ``slots``. Both methods are served at the same offered rate, each with the
    occupancy its own speed gives it (``served_occupancy``); the TPOT gain is ar's over the method's.

    - ``gain_idle``: the gain at vanishing load, one request alone (Leviathan's E / (g c + 1) with its rows' compute);
    - ``gain_full``: the gain with ``slots`` requests in both batches (NaN for unbounded slots);
    - ``occupancy``: b*, the batch at which the two cost the same per token, roof (E - 1 - g c) / (g + 1 - E) (inf when
      speculation's rows never catch up, 0 when it does not pay even alone);
    - ``rate``: the lowest offered rate at which the gain falls below 1 (0: it never pays; inf: not at any rate, the
      gain at a full batch stays above 1); ``ar_capacity``: the rate at which ar's batch fills its slots (or its
      compute saturates), for scale."""
    if any(not math.isfinite(float(x)) for x in (tokens, drafted, c, new_tokens, step)) or tokens <= 0 or step <= 0:
        nan = math.nan
        return {"gain_idle": nan, "gain_full": nan, "occupancy": nan, "rate": nan, "ar_capacity": nan}
    ar, mine = per_token_cost(1.0, 0.0, 0.0, roof_rows), per_token_cost(tokens, drafted, c, roof_rows)

    def gain(rate: float) -> float:
        return served_tpot(rate, new_tokens, step, ar, slots) / served_tpot(rate, new_tokens, step, mine, slots)

    def capacity(cost: tuple[float, float]) -> float:  # the rate that fills the slots (or saturates the compute)
        a, k = cost
        full = slots / (new_tokens * step * (a + k * slots)) if math.isfinite(slots) else math.inf
        return min(full, 1.0 / (new_tokens * step * k) if k > 0 else math.inf)

    slack = tokens - 1.0 - drafted * c
    rows = drafted + 1.0 - tokens
    b_star = 0.0 if slack <= 0 else (roof_rows * slack / rows if rows > 0 else math.inf)
    top = max(capacity(ar), capacity(mine))
    out = {
        "gain_idle": (ar[0] + ar[1]) / (mine[0] + mine[1]),
        "gain_full": gain(2.0 * top) if math.isfinite(slots) else math.nan,
        "occupancy": b_star,
        "ar_capacity": capacity(ar),
    }
    if slack <= 0:
        return out | {"rate": 0.0}
    # scan a geometric grid up to where both batches are full (past it the gain is gain_full), bisect the first crossing
    grid = np.geomspace(top * 1e-6, top * (1.0 - 1e-9), 400)
    values = np.array([gain(float(r)) for r in grid])
    below = np.flatnonzero(values < 1.0)
    if not below.size:
        return out | {"rate": math.inf}
    i = int(below[0])
    if i == 0:
        return out | {"rate": float(grid[0])}
    return out | {"rate": float(brentq(lambda r: gain(r) - 1.0, float(grid[i - 1]), float(grid[i]), xtol=1e-12))}


def break_even_verify_cost(iterations: Iterable[tuple[int, int]], c: float) -> float:
    """The row cost v at which these iterations stop beating ar (``predicted_speedup`` = 1): (tokens - iterations -
    c drafts) / drafts; a machine whose verified rows cost more than this share of a step each loses to ar. NaN
    without a drafted iteration."""
    its = list(iterations)
    drafts = sum(g for g, _ in its)
    if drafts <= 0:
        return math.nan
    return (sum(e for _, e in its) - len(its) - c * drafts) / drafts


def step_parameters(config: dict, head_rows: int | None = None) -> float:
    """The weights a decoding step reads, in parameters, from a Llama-style ``config.json``: every layer's
    attention and MLP projections and the LM head (``head_rows`` rows when the head is restricted to a
    vocabulary subset); the embedding lookup reads one row and the norms are negligible. On a memory-bound
    accelerator a step's time is this many parameters times their bytes, so two models' ratio of it (at the same
    dtype) is Leviathan's c there."""
    h = int(config["hidden_size"])
    heads = int(config["num_attention_heads"])
    kv = int(config.get("num_key_value_heads") or heads)
    head_dim = int(config.get("head_dim") or h // heads)
    inter = int(config["intermediate_size"])
    layers = int(config["num_hidden_layers"])
    attention = h * heads * head_dim * 2 + h * kv * head_dim * 2  # q and o, k and v
    mlp = 3 * h * inter  # gate, up, down
    rows = int(head_rows) if head_rows else int(config["vocab_size"])
    return float(layers * (attention + mlp) + rows * h)
