"""Batch > 1: B requests decode together through one packed KV cache per model (continuous batching).

The chain methods (``batchable`` on the method class: ar, spd, block, hsd, hsd_ref, mtad, typical over a chain) run
when a cell or the bench asks for ``batch_size > 1``, with a ``batchable`` drafter (the draft model, n-gram, EAGLE,
EAGLE-3). One iteration of the loop, over every live request:

1. draft: one batched draft-model step per draft position (each request's rows in one forward; MTAD's
   beams are tree nodes of their request); any other drafter proposes per request on its slot's own copy
   (``Drafter.fork``: n-gram lookup; an EAGLE head's own KV cache and the target features it has seen);
2. one target forward over all requests' rows (a newly admitted request's prompt included: its prefill
   rides in its first step), the LM head on the verification rows only; a drafter that reads the target's
   hidden states (``uses_hidden``: EAGLE, EAGLE-3) gets each request's hidden rows from it
   (``PackedCache.step_hidden``), and its admitted requests' prompts are prefilled in one packed forward
   before they draft, as ``DraftVerifyDecoder._start`` prefills at batch 1 (their first iteration drafts);
3. the method's own rule per request (``Decoder.verify``: the rules of ``verification.py``), with that
   request's generator;
4. rollback per request (its rejected slots leave the packed cache), the verdict to the request's drafter
   (``feedback``: kept drafts, the hidden rows of the kept positions), emit, and a finished request's slot
   takes the next prompt at once.

Packing (``PackedCache``, ``packed.py``): the sequences share one ``CachedModel`` cache; every cached position
belongs to one request (``owner``, -1 once rolled back) and each new row sees exactly its own request's live
positions, in order (``CachedModel.forward_masked_rows``), as the teacher-data engine packs its sequences
(``pipeline/training/teacher_data.py``). On the bf16 CPU kernels a row attends to its allowed keys in cache
order and every matmul row is computed alone (``csrc/bf16_decoder.cpp``), so a request's rows are
bit-identical to the ones it gets decoding alone; with the same draws from its own generator (seeded from the
cell seed and the prompt id) its tokens do not depend on its companions: the output at batch B equals the
output at batch 1, and equals ``Decoder.generate``'s. Elsewhere (float32, CUDA) rows differ by rounding and
outputs can differ; ``batch_divergence`` measures how often.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence, cast

import torch

from .base import Decoder, Generation, _as_token_list, emit
from .beam_sampling import first_beams, first_beams_sparse, next_beams, next_beams_sparse
from .drafters import Drafter, ModelDrafter
from .drafting import ChainDraft
from .packed import PackedCache, PackedRows
from .speculative import DraftVerifyDecoder
from .tree import TokenTree
from .warping import sample, sample_sparse


@dataclass
class BatchRequest:
    """One generation to run: its prompt, its own limit and its own generator (``tag``: the caller's)."""

    prompt: Sequence[int] | torch.Tensor
    max_new_tokens: int
    generator: torch.Generator | None = None
    tag: Any = None


@dataclass
class BatchedGeneration(Generation):
    """A ``Generation`` with its request's clock (``time.perf_counter`` seconds): when it took a slot, when
    its first token and its last were emitted (latency, time to first token and TPOT per request)."""

    admitted_at: float = 0.0
    first_token_at: float = 0.0
    finished_at: float = 0.0
    tag: Any = None


def check_batch(cls: type[Decoder], values: dict[str, Any], batch_size: Any) -> None:
    """Refuse a ``batch_size`` this method (with these resolved parameters) cannot run, before any model
    loads; the message names the fix."""
    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
        raise ValueError(f"batch_size must be an integer >= 1, got {batch_size!r}")
    if batch_size == 1:
        return
    reason = cls.batch_refusal(values)
    if reason:
        raise ValueError(f"method {cls.name!r} cannot decode with batch_size {batch_size}: {reason}; use batch_size: 1")


@dataclass
class _Live:
    """A request in a slot: its context, output and counters, and this iteration's draft."""

    index: int
    request: BatchRequest
    slot: int
    context: list[int]
    admitted_at: float
    out: list[int] = field(default_factory=list)
    accepted: list[int] = field(default_factory=list)
    drafted: list[int] = field(default_factory=list)
    steps: int = 0
    draft_steps: int = 0
    first_token_at: float = 0.0
    gamma: int = 0
    tokens: list[int] = field(default_factory=list)  # this iteration's draft tokens
    rows: list[torch.Tensor] = field(default_factory=list)  # their warped draft rows (dense [V] each)
    proposal: Any = None


class BatchedDecoder:
    """Continuous batching of one chain decoder (``batchable``) over ``batch_size`` slots.

    ``decoder`` is the method as ``build_decoder`` made it (parameters validated, warper, models, drafter, rule);
    this class owns only the packing and the loop. Its models' caches are packed while ``run`` works and
    emptied after it (the decoder's own ``generate`` can be called again).
    """

    def __init__(self, decoder: Decoder, batch_size: int) -> None:
        check_batch(type(decoder), decoder.config, batch_size)
        reason = type(decoder).batch_refusal(decoder.config)
        if reason:  # at batch 1 too: this loop is the chain loop (a tree method's batch 1 is its own generate)
            raise ValueError(
                f"method {decoder.name!r} has no batched loop: {reason}; call its generate() one request at a time"
            )
        self.decoder = decoder
        self.batch_size = batch_size
        self.drafter = getattr(decoder, "drafter_impl", None)
        self.gamma = int(decoder.config.get("gamma") or 0) if self.drafter is not None else 0
        self.beams = bool(getattr(type(decoder), "beam_drafts", False)) and isinstance(self.drafter, ModelDrafter)
        # a drafter that proposes per request gets one copy per slot (``Drafter.fork``: an EAGLE head's own cache
        # and features); one that reads the target's hidden states gets each request's rows of every target step
        self.slots: list[Drafter] | None = None
        if self.drafter is not None and not isinstance(self.drafter, ModelDrafter):
            self.slots = [self.drafter.fork() for _ in range(batch_size)]
        self.hidden = self.slots is not None and self.drafter is not None and self.drafter.uses_hidden

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        *,
        max_new_tokens: int,
        eos_token_ids: Sequence[int] | int | None = (),
        generators: Sequence[torch.Generator | None] | None = None,
    ) -> list[BatchedGeneration]:
        """Decode every prompt (``generators[i]``: prompt i's own), ``batch_size`` at a time; results in prompt
        order."""
        gens = list(generators) if generators is not None else [None] * len(prompts)
        if len(gens) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(gens)} generators: pass one generator per prompt")
        queue = deque(BatchRequest(p, max_new_tokens, g, tag=i) for i, (p, g) in enumerate(zip(prompts, gens)))
        out: list[BatchedGeneration | None] = [None] * len(prompts)

        def done(request: BatchRequest, gen: BatchedGeneration) -> None:
            out[request.tag] = gen

        self.run(queue, eos_token_ids=eos_token_ids, on_finish=done)
        return out  # type: ignore[return-value]

    def _check(self, request: BatchRequest) -> list[int]:
        prompt = _as_token_list(request.prompt)
        if not prompt:
            raise ValueError("input_ids is empty: a prompt needs at least one token (e.g. BOS)")
        m = request.max_new_tokens
        if not isinstance(m, int) or isinstance(m, bool) or m < 1:
            raise ValueError(f"max_new_tokens must be an integer >= 1, got {m!r}")
        limit = self.decoder.target.max_positions
        if limit is not None and len(prompt) + m > limit:
            raise ValueError(
                f"prompt ({len(prompt)} tokens) + max_new_tokens ({m}) exceeds the target's context of {limit} "
                "positions: shorten the prompt or lower max_new_tokens"
            )
        return prompt

    def run(
        self,
        queue: deque,
        *,
        eos_token_ids: Sequence[int] | int | None = (),
        on_finish: Callable[[BatchRequest, BatchedGeneration], None] | None = None,
    ) -> int:
        """Decode the requests of ``queue`` (taken from the left as slots free up; ``on_finish`` may append
        more, e.g. a conversation's next turn) until it is empty and every slot is idle. Returns the number
        of requests decoded."""
        eos = (
            frozenset([eos_token_ids])
            if isinstance(eos_token_ids, int)
            else frozenset(int(t) for t in (eos_token_ids or ()))
        )
        dec = self.decoder
        with torch.inference_mode():
            target = PackedCache(dec.target)
            draft = PackedCache(dec.draft_model) if isinstance(self.drafter, ModelDrafter) else None
            live: list[_Live] = []
            free = list(range(self.batch_size))[::-1]
            count = 0
            try:
                while queue or live:
                    admitted = []
                    while queue and free:
                        request = queue.popleft()
                        prompt = self._check(request)
                        admitted.append(_Live(count, request, free.pop(), list(prompt), time.perf_counter()))
                        count += 1
                    if admitted and self.slots is not None:
                        self._start(admitted, target)
                    live.extend(admitted)
                    self._iterate(live, target, draft, eos)
                    for r in [r for r in live if r.slot < 0]:
                        live.remove(r)
                        free.append(-r.slot - 1)
                        gen = BatchedGeneration(
                            r.out,
                            r.steps,
                            r.draft_steps,
                            r.accepted,
                            r.drafted,
                            admitted_at=r.admitted_at,
                            first_token_at=r.first_token_at,
                            finished_at=time.perf_counter(),
                            tag=r.request.tag,
                        )
                        if on_finish is not None:
                            on_finish(r.request, gen)
            finally:
                for model in (dec.target, dec.draft):
                    if model is not None:
                        model.reset()
        return count

    # ------------------------------------------------------------------------------------------ one iteration

    def _start(self, requests: list[_Live], target: PackedCache) -> None:
        """Start the admitted requests' own drafters (``slots``). One that reads the target's hidden states gets
        those of ``prompt[:-1]``, prefilled for every admitted request in one packed target forward, as
        ``DraftVerifyDecoder._start`` prefills at batch 1 (its first iteration then drafts, as it would alone);
        the other drafters' prompts ride in their request's first target step."""
        assert self.slots is not None
        hidden: dict[int, torch.Tensor] = {}
        if self.hidden:
            groups = [
                PackedRows(r.slot, torch.tensor(r.context[:-1], dtype=torch.long), [])
                for r in requests
                if len(r.context) > 1
            ]
            if groups:
                hidden = dict(zip([g.slot for g in groups], target.step_hidden(groups)[1]))
        for r in requests:
            rows = hidden.get(r.slot, self.decoder.target.prefill_hidden([])) if self.hidden else None
            self.slots[r.slot].start(r.context, rows)  # a one-token prompt: no rows (prefill_hidden of nothing)

    def _iterate(self, live: list[_Live], target: PackedCache, draft: PackedCache | None, eos: frozenset[int]) -> None:
        dec = self.decoder
        for r in live:
            r.gamma = min(self.gamma, r.request.max_new_tokens - len(r.out) - 1)
            r.tokens, r.rows, r.proposal = [], [], None
        if draft is not None and self.beams:
            self._draft_beams([r for r in live if r.gamma > 0], draft)
        elif draft is not None:
            self._draft_model([r for r in live if r.gamma > 0], draft)
        elif self.slots is not None:
            for r in live:
                if r.gamma > 0:
                    drafter = self.slots[r.slot]
                    before = drafter.forwards
                    self._take_chain(r, drafter.propose(r.context, r.gamma, dec.warper, r.request.generator))
                    r.draft_steps += drafter.forwards - before
        for r in live:
            r.gamma = len(r.tokens)
        groups = []
        for r in live:
            feed = r.context[target.length(r.slot) :] + r.tokens
            groups.append(
                PackedRows(
                    r.slot, torch.tensor(feed, dtype=torch.long), list(range(len(feed) - r.gamma - 1, len(feed)))
                )
            )
        raws, hiddens = target.step_hidden(groups) if self.hidden else (target.step(groups), [None] * len(groups))
        for r, raw, hidden in zip(live, raws, hiddens):
            logits = dec.target._logits(raw)
            gen = r.request.generator
            length = len(r.context)
            r.steps += 1
            n = 0
            if r.gamma == 0:
                emitted = [int(dec._next_token(logits[-1], gen))]
                if self.drafter is not None:
                    r.drafted.append(0)
            else:  # drafts came from a drafter: the decoder verifies chains (DraftVerifyDecoder's interface)
                chains = cast(DraftVerifyDecoder, dec)
                tokens = torch.tensor(r.tokens, dtype=torch.long, device=logits.device)
                proposal = r.proposal if self.beams else chains.chain_proposal(tokens, torch.stack(r.rows))
                accepted, token = chains.verify(logits, tokens, proposal, gen)
                n, y = int(accepted), int(token)
                emitted = r.tokens[:n] + [y]
                r.drafted.append(r.gamma)
                target.rollback(r.slot, length + n)
                if draft is not None:
                    draft.rollback(r.slot, length + n)
            if self.slots is not None:  # the verdict, with the hidden rows of the last context token and the kept
                kept = None if hidden is None else hidden[hidden.shape[0] - r.gamma - 1 :][: n + 1]
                self.slots[r.slot].feedback(length, n, kept)
            if not r.out:
                r.first_token_at = time.perf_counter()
            if emit(emitted, eos, r.request.max_new_tokens, r.out, r.context, r.accepted):
                target.release(r.slot)
                if draft is not None:
                    draft.release(r.slot)
                r.slot = -r.slot - 1  # finished: the loop frees the slot

    def _take_chain(self, r: _Live, chain: ChainDraft | None) -> None:
        if chain is None:
            return
        r.tokens = [int(t) for t in chain.tokens.tolist()]
        r.rows = list(chain.probs)

    def _draft_model(self, requests: list[_Live], draft: PackedCache) -> None:
        """``drafting.draft_chain`` for every request at once: one packed draft forward per draft position,
        each request's row warped and sampled with its own generator (the same draws as alone)."""
        dec = self.decoder
        model, warper = dec.draft_model, dec.warper
        sparse = warper.sparse(model.vocab_size)
        for j in range(max((r.gamma for r in requests), default=0)):
            step = [r for r in requests if r.gamma > j]
            groups = []
            for r in step:
                feed = r.context[draft.length(r.slot) :] if j == 0 else r.tokens[-1:]
                groups.append(PackedRows(r.slot, torch.tensor(feed, dtype=torch.long), [len(feed) - 1]))
            raws = draft.step(groups)
            for r, raw in zip(step, raws):
                gen = r.request.generator
                if sparse:
                    ids, probs = model.top_k_rows(raw[0], warper)
                    row = torch.zeros(model.vocab_size, device=model.device).scatter_(-1, ids, probs)
                    t = sample_sparse(ids, probs, gen)
                else:
                    row = warper(model._logits(raw)[0])
                    t = sample(row, gen) if not warper.greedy else row.argmax(-1)
                r.tokens.append(int(t))
                r.rows.append(row)
                r.draft_steps += 1

    def _draft_beams(self, requests: list[_Live], draft: PackedCache) -> None:
        """``beam_sampling.beam_sample`` (MTAD's draft) for every request at once: each request's W beams are
        tree nodes of its own sequence, one packed draft forward per depth; the chosen beam's nodes stay."""
        dec = self.decoder
        model, warper = dec.draft_model, dec.warper
        W, weights_kind, replacement = int(dec.args.num_beams), dec.args.beam_weights, bool(dec.args.replacement)
        sparse = not warper.greedy and model.device.type == "cpu" and warper.sparse(model.vocab_size)
        state: dict[int, dict[str, Any]] = {}
        for j in range(max((r.gamma for r in requests), default=0)):
            step = [r for r in requests if r.gamma > j]
            groups = []
            for r in step:
                if j == 0:
                    feed = r.context[draft.length(r.slot) :]
                    groups.append(PackedRows(r.slot, torch.tensor(feed, dtype=torch.long), [len(feed) - 1]))
                    continue
                s = state[r.index]
                parents = [n[-1] if n else -1 for n in s["nodes"]]
                s["fed"] = s["tree"].extend(s["beams"][:, -1].tolist(), parents)
                old = s["tree"].fed
                ids, positions, mask = s["tree"].feed()
                m = ids.numel()
                sees = torch.cat([torch.ones(m, s["start"], dtype=torch.bool), mask[:, :old]], 1)
                groups.append(
                    PackedRows(r.slot, ids, list(range(m)), positions=positions, sees=sees, inner=mask[:, old:])
                )
            raws = draft.step(groups)
            for r, raw in zip(step, raws):
                gen = r.request.generator
                r.draft_steps += 1
                if j == 0:
                    start = draft.length(r.slot)
                    s = state[r.index] = {"start": start, "tree": TokenTree(start)}
                    if sparse:
                        ids, probs = model.top_k_rows(raw[0], warper)
                        first, s["weights"], s["log_q"] = first_beams_sparse(
                            ids, probs, W, gen, weights_kind, replacement
                        )
                    else:
                        logits = model._logits(raw)[0]
                        first, s["weights"], s["log_q"] = first_beams(logits, W, warper, gen, weights_kind, replacement)
                    s["beams"] = first[:, None]
                    s["nodes"] = [[] for _ in range(len(s["beams"]))]
                    continue
                s = state[r.index]
                weights = s["weights"]
                if sparse:
                    ids, probs = model.top_k_rows(raw, warper)
                    b, v, s["weights"], step_lq = next_beams_sparse(
                        ids, probs, weights, W, gen, weights_kind, replacement
                    )
                else:
                    b, v, s["weights"], step_lq = next_beams(
                        model._logits(raw), weights, W, warper, gen, weights_kind, replacement
                    )
                s["log_q"] = torch.cat([s["log_q"][b], step_lq[:, None]], 1)
                s["beams"] = torch.cat([s["beams"][b], v[:, None]], 1)
                s["nodes"] = [s["nodes"][i] + [s["fed"][i]] for i in b.tolist()]
        for r in requests:
            s = state[r.index]
            best = int(s["weights"].argmax())
            path = s["nodes"][best]
            if path:
                draft.keep_path(r.slot, s["start"], path)
            r.tokens = [int(t) for t in s["beams"][best].tolist()]
            r.proposal = s["log_q"][best]


def batch_divergence(
    decoder: Decoder,
    prompts: Sequence[Sequence[int]],
    *,
    batch_size: int,
    max_new_tokens: int,
    seeds: Sequence[int],
    eos_token_ids: Sequence[int] = (),
) -> dict[str, float]:
    """How often a request's output at ``batch_size`` differs from its output at batch 1 (same generator seeds):
    ``{"requests", "differing", "fraction", "first_difference_mean"}`` (0 differing on the bf16 kernels;
    float32 and CUDA rows are not batch-invariant, so this measures what batching changes there)."""

    def run(b: int) -> list[BatchedGeneration]:
        gens = [torch.Generator(device=decoder.target.device).manual_seed(int(s)) for s in seeds]
        return BatchedDecoder(decoder, b).generate(
            prompts, max_new_tokens=max_new_tokens, eos_token_ids=eos_token_ids, generators=gens
        )

    alone, together = run(1), run(batch_size)
    firsts = []
    for a, t in zip(alone, together):
        if a.tokens != t.tokens:
            firsts.append(
                next(
                    (i for i, (x, y) in enumerate(zip(a.tokens, t.tokens)) if x != y), min(len(a.tokens), len(t.tokens))
                )
            )
    n = len(alone)
    return {
        "requests": n,
        "differing": len(firsts),
        "fraction": len(firsts) / n if n else float("nan"),
        "first_difference_mean": sum(firsts) / len(firsts) if firsts else float("nan"),
    }
