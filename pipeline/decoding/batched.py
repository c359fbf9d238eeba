"""The speculative loop: one iteration (propose, verify, emit, feedback) over per-request state, at every batch size,
for chains and trees alike.

``Decoder.generate`` of every chain method (ar, spd, block, hsd, hsd_ref, mtad, typical over a chain, bild), of
every tree method (specinfer, mcss, traversal, spectr, medusa, typical over a tree) and of mtjd is this loop over
one request (``BatchedDecoder(decoder, 1)``), and a cell or the bench with ``batch_size > 1`` runs it over
``batch_size`` slots (continuous batching; ``batch_refusal`` of the configured method's ``Capabilities``: a loop of
its own, or a drafter that does not declare ``batchable``). The method's declared ``loop`` (``contract.py``) chooses
how: ``plain`` (ar), ``chain`` (``ChainMethod``), ``tree`` (``TreeMethod``), ``draw`` (``DrawMethod``) or ``own``.
Each request has its own context, counters, generator, draft-length policy (``draft_stop``: its own running acceptance
estimate) and drafter (``Drafter.slots``: the decoder's own drafter at batch 1; at batch B a copy
per slot, the draft model's copies sharing one packed cache). One iteration, over every live request:

1. propose: the method asks for each request's chain (``DraftVerifyDecoder.propose_chains``: the drafter's chains,
   ``Drafter.propose_chains``, or MTAD's beams, ``ModelDrafter.propose_beams``; the draft model drafts every
   request's chain in one forward per draft position, ``drafting.draft_chain``, BiLD's small-model runs included,
   with its confidence read before each draw) or, for a tree method, its token tree
   (``DraftVerifyDecoder.propose_trees``: ``Drafter.propose_trees``; the draft model draws every request's tree in
   one forward per level, ``tree_verify.draft_trees``); the drafting lives in the drafter, none here;
2. verify: one target forward over every request's rows (a newly admitted request's prompt included at batch > 1:
   its prefill rides in its first step): a chain's ``[last token] + drafts`` causally, a tree's ``[last token] +
   nodes`` with its tree mask (each node sees its request's context, its ancestors and itself), the LM head on the
   verification rows only; the method's rule (``Decoder.verify``) or walk (``verify_tree``) per request, with that
   request's generator, or a plain step where nothing was drafted;
3. emit: the kept drafts (a chain's prefix, a tree's path) and the next token, cut at EOS and ``max_new_tokens``;
4. feedback: rollback of the rejected positions (a tree: its path's KV compacted into place), the verdict to the
   request's draft-length policy (chains) and drafter (with the target's hidden rows of the last context token and
   the kept positions for a drafter that reads them, ``uses_hidden``); a finished request's slot takes the next
   prompt at once.

The models' caches are ``packed.SoloCache`` at batch 1 (the model's own cache: the prompt prefilled and timed,
the bf16 kernels' fused draft chain and the CUDA graphs as ``CachedModel.forward`` has them) and
``packed.PackedCache`` at batch > 1: the sequences share one ``CachedModel`` cache; every cached position belongs
to one request and each new row sees exactly its own request's live positions, in order
(``CachedModel.forward_masked_rows``), as the teacher-data engine packs its sequences
(``pipeline/training/teacher_data.py``). On the bf16 CPU kernels a row attends to its allowed keys in cache order
and every matmul row is computed alone (``csrc/bf16_decoder.cpp``), so a request's rows are bit-identical to the
ones it gets decoding alone; with the same draws from its own generator (seeded from the cell seed and the prompt
id) its tokens and counters do not depend on its companions: the output at batch B equals the output at batch 1,
which is ``Decoder.generate``'s. Elsewhere (float32, CUDA) rows differ by rounding and outputs can differ;
``divergence.batch_divergence`` measures how often.

The loop times itself (``phase_clock.PhaseClock``, ``BatchedDecoder.clock``): each iteration's wall time goes to
draft (step 1 and the drafter's feedback), verify (step 2's forward), rule (the rule, emitting, rollback) and other
(admission, the batch-1 prefill, building rows, bookkeeping), with what the iteration did (rows, draft positions,
tokens emitted, context, occupancy); a cell's cost model and the bench's rows are read off these records
(``pipeline.measure.costs.cost_model``), ``draft_cost: auto`` reads them live (``phase_clock.LiveCosts``), and
with ``calibrate=True`` (a cell's warm-up) every request drafts the calibration schedule
(``draft_length.calibration_length``).

A method whose target draws its own tokens, unverified (mtjd, loop ``draw``: ``draw_tokens``, beam sampling on the
target's sequences, every request's beams in one packed target forward per depth), runs the same loop with steps 1 and
2 replaced by that draw: each request emits what it drew and the target's cache is left at it. Beam search (loop
``own``) runs its ``generate`` request by request at batch 1 and does not batch.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any, Callable, Collection, Sequence

import torch

from .base import Decoder, Generation, _as_token_list, check_request, emit, eos_set
from .contract import ChainMethod, DrawMethod, TreeMethod, chain_method, draw_method, stepped_method, tree_method
from .draft_length import DraftLength, calibration_length
from .drafters import Drafter
from .drafting import ChainAsk, TreeAsk
from .packed import Lanes, PackedCache, PackedRows, SoloCache
from .phase_clock import PhaseClock
from .requests import BatchedGeneration, BatchRequest, LiveRequest, arrive, check_batch, occupy, refuse_batch  # noqa: F401


class BatchedDecoder:
    """The loop of one decoder over ``batch_size`` slots (batch 1: ``Decoder.generate``'s own loop); at batch 1
    a method with a loop of its own (beam) runs its ``generate`` request by request behind the same ``run``
    (the window and the bench decode every method through this class).

    ``decoder`` is the method as ``build_decoder`` made it (parameters validated, warper, models, drafter, rule);
    this class owns the per-request state, the caches' view (``SoloCache`` at batch 1, ``PackedCache`` above) and
    the iteration. At batch > 1 the caches are packed while ``run`` works and emptied after it (the decoder's own
    ``generate`` can be called again).
    """

    def __init__(self, decoder: Decoder, batch_size: int, *, calibrate: bool = False) -> None:
        caps = decoder.capabilities
        refuse_batch(decoder.name, caps.batch_refusal, batch_size)
        self.decoder = decoder
        self.batch_size = batch_size
        self.clock = PhaseClock(decoder.target.device)  # the loop's own clock (``phase_clock``)
        self.calibrate = calibrate  # every request's draft length (a tree's depth) cycles (``calibration_length``)
        self.asked = 0  # this iteration's requests that asked for a draft (an iteration whose drafts all declined at
        # once still paid one draft position: BiLD's small model, unsure at its first token)
        self.own_loop = caps.loop == "own"  # batch 1 of a method with its own loop: its generate, request by request
        # the method through the protocol its declared loop needs (``contract.py``; a missing part is refused here)
        self.chain: ChainMethod | None = chain_method(decoder) if caps.loop == "chain" else None
        self.trees: TreeMethod | None = tree_method(decoder) if caps.loop == "tree" else None  # (``_propose_trees``)
        self.drawer: DrawMethod | None = draw_method(decoder) if caps.loop == "draw" else None  # (``_draw``)
        self.method = None if self.own_loop else stepped_method(decoder)
        over = self.chain or self.trees  # a method over a drafter
        drafter = over.drafter_impl if over is not None else None
        self.drafter = drafter
        self.slots: list[Drafter | None] = [None] * batch_size
        if drafter is not None:
            self.slots = list(drafter.slots(batch_size))
        self.hidden = drafter is not None and drafter.uses_hidden
        self.prompt_hidden = self.hidden and drafter is not None and drafter.prompt_hidden
        self.target: Lanes = SoloCache(decoder.target) if batch_size == 1 else PackedCache(decoder.target)
        self.template: DraftLength | None = over.length_policy if over is not None else None  # copied per request
        if self.template is not None and self.template.live is not None:  # draft_cost / verify_cost: auto read
            self.clock.observers.append(self.template.live.observe)  # the clock

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
        got = [g for g in out if g is not None]
        assert len(got) == len(out), "a request of the queue was not decoded"
        return got

    def decode(
        self, prompt: list[int], max_new_tokens: int, eos: frozenset[int], generator: torch.Generator | None
    ) -> Generation:
        """One request, checked by the caller (``Decoder.generate``): its ``Generation``."""
        got: list[BatchedGeneration] = []
        self.run(
            deque([BatchRequest(prompt, max_new_tokens, generator)]),
            eos_token_ids=eos,
            on_finish=lambda r, g: got.append(g),
        )
        g = got[0]
        return Generation(g.tokens, g.steps, g.draft_steps, g.accepted, g.drafted)

    def _check(self, request: BatchRequest) -> list[int]:
        """A request's prompt as token ids, checked (``base.check_request``: the one check of a request)."""
        prompt = _as_token_list(request.prompt)
        check_request(prompt, request.max_new_tokens, self.decoder.target.max_positions)
        return prompt

    def run(
        self,
        queue: deque[BatchRequest],
        *,
        eos_token_ids: Collection[int] | int | None = (),
        on_finish: Callable[[BatchRequest, BatchedGeneration], None] | None = None,
        arrivals: Any = None,
    ) -> int:
        """Decode the requests of ``queue`` (taken from the left as slots free up; ``on_finish`` may append
        more, e.g. a conversation's next turn) until it is empty and every slot is idle. Returns the number
        of requests decoded.

        ``arrivals`` (a workload's, ``pipeline.measure.workload.Arrivals``): polled before each iteration, its
        ``feed(queue, idle)`` appends the requests whose time has come (sleeping until the next one when nothing is
        queued or decoding) and says whether more are to come; the run lasts until none are."""
        eos = eos_set(eos_token_ids)
        if self.own_loop:
            return self._run_own(queue, eos, on_finish, arrivals)
        live: list[LiveRequest] = []
        free = list(range(self.batch_size))[::-1]
        count = 0
        clock = self.clock
        with torch.inference_mode():
            self._close()
            clock.start()
            try:
                while arrive(arrivals, queue, live, clock) or queue or live:
                    admitted: list[LiveRequest] = []
                    while queue and free:
                        request = queue.popleft()
                        prompt = self._check(request)
                        slot = free.pop()
                        admitted.append(
                            LiveRequest(count, request, slot, list(prompt), time.perf_counter(), self.slots[slot])
                        )
                        count += 1
                    if admitted:
                        self._start(admitted)
                    live.extend(admitted)
                    if not live:  # every request still to come (a workload's: ``arrivals``)
                        continue
                    occupy(live, self.batch_size)
                    self._iterate(live, eos)
                    for r in [r for r in live if r.slot < 0]:
                        live.remove(r)
                        free.append(-r.slot - 1)
                        gen = BatchedGeneration(
                            r.out,
                            r.steps,
                            r.drafter.forwards if r.drafter is not None else 0,
                            r.accepted,
                            r.drafted,
                            admitted_at=r.admitted_at,
                            first_token_at=r.first_token_at,
                            finished_at=time.perf_counter(),
                            prefill_s=r.prefill_s,
                            tag=r.request.tag,
                        )
                        if on_finish is not None:  # the caller's time: on no phase
                            phase = clock.pause()
                            on_finish(r.request, gen)
                            clock.resume(phase)
            finally:
                clock.stop()
                self._close()
        return count

    def _close(self) -> None:
        """Empty packed caches (a no-op at batch 1, whose caches keep the last request and its prefill time)."""
        self.target.close()
        for d in {id(d): d for d in self.slots if d is not None}.values():
            d.close()

    def _run_own(
        self,
        queue: deque[BatchRequest],
        eos: frozenset[int],
        on_finish: Callable[[BatchRequest, BatchedGeneration], None] | None,
        arrivals: Any = None,
    ) -> int:
        """A method with a loop of its own (beam) at batch 1: its ``generate`` per request,
        bracketed by device synchronisations; its first token's time is estimated as its prefill plus one step."""
        dec, count = self.decoder, 0
        device = dec.target.device

        def sync() -> None:
            if device.type == "cuda":
                torch.cuda.synchronize(device)

        clock = self.clock
        clock.start()
        while arrive(arrivals, queue, (), clock) or queue:
            if not queue:
                continue
            request = queue.popleft()
            sync()
            t0 = time.perf_counter()
            clock.enter("verify")  # beam search: the target's forwards, its own loop (one record per request)
            gen = dec.generate(
                request.prompt,
                max_new_tokens=request.max_new_tokens,
                eos_token_ids=sorted(eos),
                generator=request.generator,
            )
            sync()
            end = time.perf_counter()
            prefill = float(dec.prefill_seconds())
            count += 1
            clock.enter("other")
            clock.end_iteration(emitted=len(gen.tokens), context=len(_as_token_list(request.prompt)), requests=1)
            if on_finish is not None:
                phase = clock.pause()
                on_finish(
                    request,
                    BatchedGeneration(
                        gen.tokens,
                        gen.steps,
                        gen.draft_steps,
                        gen.accepted,
                        gen.drafted,
                        admitted_at=t0,
                        first_token_at=t0 + prefill + (end - t0 - prefill) / max(gen.steps, 1),
                        finished_at=end,
                        prefill_s=prefill,
                        tag=request.tag,
                    ),
                )
                clock.resume(phase)
        clock.stop()
        return count

    # ------------------------------------------------------------------------------------------ one iteration

    def _start(self, requests: list[LiveRequest]) -> None:
        """Start the admitted requests: the target caches ``prompt[:-1]`` (at batch 1; at batch > 1 it rides in the
        request's first step, unless the drafter reads the prompt's hidden states: then every admitted prompt is
        written in one packed forward), each request's drafter starts (with those hidden states) and its
        draft-length policy (a copy of the decoder's, with the costs a cell calibrated) starts from the prior."""
        dec = self.decoder
        hidden = self.target.start({r.slot: r.context for r in requests}, self.prompt_hidden)
        template = self.template  # its costs as calibrated (``auto``)
        for r in requests:
            if r.drafter is not None:
                r.drafter.start(r.context, hidden.get(r.slot))
                r.policy = template.fresh() if template is not None else None
            r.prefill_s = dec.prefill_seconds() if self.target.solo else 0.0
            r.cached = self.target.length(r.slot)

    def _propose_chains(self, live: list[LiveRequest], eos: frozenset[int]) -> None:
        """Step 1 of a chain method: each request's chain (``r.tokens``, ``r.proposal``), up to its policy's budget
        (``eos``: the run's, for a method whose draft ends after one: BiLD's)."""
        dec = self.chain
        assert dec is not None
        asks: list[tuple[LiveRequest, ChainAsk]] = []
        for r in live:
            if r.policy is not None:
                room = r.request.max_new_tokens - len(r.out) - 1
                full = dec.draft_depth
                wanted = calibration_length(r.iterations, full) if self.calibrate else r.policy.budget(full)
                gamma = min(wanted, room)
                if gamma > 0:
                    asks.append((r, ChainAsk(r.slot, r.context, gamma, r.request.generator, r.drafter, eos)))
        self.asked = len(asks)
        if asks:
            proposals = dec.propose_chains([a for _, a in asks])
            for (r, _), proposed in zip(asks, proposals):
                if proposed is not None:
                    r.tokens, r.proposal = proposed

    def _propose_trees(self, live: list[LiveRequest]) -> None:
        """Step 1 of a tree method: each request's tree (``r.tree``) of at most the levels left before its limit."""
        dec = self.trees
        assert dec is not None
        asks: list[tuple[LiveRequest, TreeAsk]] = []
        for r in live:
            full = dec.draft_depth
            depth = min(
                calibration_length(r.iterations, full) if self.calibrate else full,
                r.request.max_new_tokens - len(r.out) - 1,
            )
            if depth > 0:
                shape = dec.tree_shape(depth)
                asks.append((r, TreeAsk(r.slot, r.context, shape, r.request.generator, r.drafter)))
        self.asked = len(asks)
        if asks:
            trees = dec.propose_trees([a for _, a in asks])
            for (r, _), tree in zip(asks, trees):
                r.tree = tree

    def _rows(self, r: LiveRequest) -> PackedRows:
        """Step 2's rows of one request: the context it has not cached yet (at batch 1 its last token; at batch > 1
        a new request's prompt), then its chain (causal) or its tree's nodes (each seeing the context, its
        ancestors and itself); the rows kept: the last context token's and the drafts'."""
        tail = r.context[r.cached :]
        t = len(tail)
        if r.tree is not None:
            ids, positions, mask = r.tree.with_root(tail[-1])  # [1 + n]: the last context token, then the nodes
            n = len(r.tree)
            if t > 1:  # the uncached context before it, causal; every node sees all of it
                ids = torch.cat([torch.tensor(tail[:-1], dtype=torch.long), ids])
                positions = torch.cat([torch.arange(r.cached, r.cached + t - 1), positions])
                inner = torch.ones(t + n, t + n, dtype=torch.bool).tril()
                inner[t - 1 :, t - 1 :] = mask
                inner[t:, : t - 1] = True
                mask = inner
            return PackedRows(r.slot, ids, list(range(t - 1, t + n)), positions, None, mask)
        if r.tokens is None:
            return PackedRows(r.slot, torch.tensor(tail, dtype=torch.long), [t - 1])
        g = r.tokens.shape[0]
        feed = torch.cat([torch.tensor(tail, dtype=torch.long, device=r.tokens.device), r.tokens])
        return PackedRows(r.slot, feed, list(range(t - 1, t + g)))

    def _draw(self, live: list[LiveRequest], eos: frozenset[int]) -> None:
        """Steps 1 and 2 of a method whose target draws its own tokens, unverified (``draw_tokens``: mtjd's beam
        sampling on the target's sequences, every request's in one packed forward per depth; ``ask.gamma``: the
        tokens left before its limit), then step 3: each request emits what it drew (its steps: one target forward
        per token drawn)."""
        clock = self.clock
        context = sum(len(r.context) for r in live)
        asks = [ChainAsk(r.slot, r.context, r.request.max_new_tokens - len(r.out), r.request.generator) for r in live]
        clock.enter("verify")
        assert self.drawer is not None
        drawn = self.drawer.draw_tokens(self.target, asks)
        clock.enter("rule")
        before = sum(len(r.out) for r in live)
        for r, tokens in zip(live, drawn):
            r.steps += len(tokens)
            self._emit(r, tokens, eos)
        clock.enter("other")
        emitted = sum(len(r.out) for r in live) - before
        clock.end_iteration(rows=sum(len(t) for t in drawn), emitted=emitted, context=context, requests=len(live))

    def _emit(self, r: LiveRequest, emitted: list[int], eos: frozenset[int]) -> None:
        """Step 3 of a request: ``emitted``, cut at EOS and its limit; a finished request leaves its slot."""
        if not r.out:
            r.first_token_at = time.perf_counter()
        if emit(emitted, eos, r.request.max_new_tokens, r.out, r.context, r.accepted):
            self.target.release(r.slot)
            if r.drafter is not None:
                r.drafter.finish()
            r.slot = -r.slot - 1  # finished: the loop frees the slot

    def _iterate(self, live: list[LiveRequest], eos: frozenset[int]) -> None:
        """One iteration over every live request, each phase on the clock (``phase_clock``)."""
        if self.drawer is not None:
            self._draw(live, eos)
            return
        dec = self.method
        assert dec is not None
        target = self.target
        clock = self.clock
        context = sum(len(r.context) for r in live)
        before = sum(len(r.out) for r in live)
        for r in live:  # 1. propose
            r.tokens, r.proposal, r.tree = None, None, None
        self.asked = 0  # requests asked for a draft this iteration
        if self.drafter is not None:  # ar drafts nothing: no draft phase
            clock.enter("draft")
            if self.trees is not None:
                self._propose_trees(live)
            else:
                self._propose_chains(live, eos)
            clock.enter("other")
        groups = [self._rows(r) for r in live]  # 2. one target forward
        hiddens: list[torch.Tensor | None]
        clock.enter("verify")
        if self.hidden:
            raws, got = target.step_hidden(groups)
            hiddens = list(got)
        else:
            raws, hiddens = target.step(groups), [None] * len(groups)
        clock.enter("rule")
        positions = drafted = prefill = 0
        for r, rows in zip(live, groups):
            prefill += rows.keep[0]  # the uncached context before the last token (a new request's prompt)
            if r.tree is not None:
                positions, drafted = (
                    max(positions, max(r.tree.depths) + 1 if r.tree.depths else 0),
                    drafted + len(r.tree),
                )
            elif r.tokens is not None:
                positions, drafted = max(positions, int(r.tokens.shape[0])), drafted + int(r.tokens.shape[0])
        if self.asked and not positions:  # asked, and every draft declined at once (BiLD's small model unsure)
            positions = 1
        for r, rows, raw, hidden in zip(live, groups, raws, hiddens):
            r.iterations += 1
            logits = dec.target.logits(raw)
            gen = r.request.generator
            length = len(r.context)
            last = rows.keep[0]  # the last context token's row (``hidden``'s rows are all of the request's rows)
            r.steps += 1
            n = 0
            kept_rows: list[int] | None = None  # a tree's: the hidden rows of the last context token and the path
            path: list[int] | None = None
            if r.tree is not None:  # the method's walk over the tree
                tree = r.tree
                assert self.trees is not None
                path, y = self.trees.verify_tree(logits, tree, gen)
                n = len(path)
                emitted = [tree.tokens[i] for i in path] + [int(y)]
                r.drafted.append(max(tree.depths) + 1 if tree.depths else 0)
                target.keep_path(r.slot, length, path)
                kept_rows = [last] + [last + 1 + i for i in path]
            elif r.tokens is None:  # nothing drafted: a plain step
                emitted = [dec.next_token(logits[-1], gen)]
                if r.policy is not None:
                    r.drafted.append(0)
            else:  # the method's rule, then the iteration's one host read
                tokens = r.tokens
                g = tokens.shape[0]
                assert self.chain is not None
                n_t, y_t = self.chain.verify(logits, tokens, r.proposal, gen)
                head = [torch.as_tensor(v, device=tokens.device).reshape(1) for v in (n_t, y_t)]
                read = torch.cat([*head, tokens]).tolist()
                n = int(read[0])
                emitted = read[2 : 2 + n] + [int(read[1])]
                r.drafted.append(g)
                target.rollback(r.slot, length + n)
                assert r.policy is not None
                r.policy.observe(g, n)
            r.cached = length + n
            if r.drafter is not None:  # 4. feedback, with the hidden rows of the last context token and the kept
                kept = None
                if hidden is not None:
                    kept = hidden[last : last + n + 1] if kept_rows is None else hidden[kept_rows]
                clock.enter("draft")  # the drafter's own work
                r.drafter.feedback(length, n, kept, r.tree, path)
                clock.enter("rule")
            self._emit(r, emitted, eos)  # 3. emit
        clock.enter("other")
        clock.end_iteration(
            rows=sum(int(g.tokens.shape[0]) for g in groups),
            prefill_rows=prefill,
            positions=positions,
            drafted=drafted,
            emitted=sum(len(r.out) for r in live) - before,
            context=context,
            requests=len(live),
        )
