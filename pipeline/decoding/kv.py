"""KV-cache handling shared by every method: prefill, extend, roll back, tree forwards, compaction.

``CachedModel`` wraps a transformers causal LM with a KV cache in buffers that grow by doubling
(``PreallocatedLayer``: allocated once at a first capacity and doubled when a write would pass it, not per
token). Appending writes in place; rolling back after a rejection only moves the length (stale slots are never
attended: later writes overwrite them), so the prefix is never re-computed and nothing is copied.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Iterator, Sequence, cast

import torch
from transformers.cache_utils import Cache, DynamicLayer

from .fast_forward import lean_forward_for
from .vocab import token_map_of

_INITIAL_CAPACITY = 256


def preallocated_layers(cache: Cache) -> list["PreallocatedLayer"]:
    """The layers of a cache made with ``layer_class_to_replicate=PreallocatedLayer`` (all of them are)."""
    return cast("list[PreallocatedLayer]", cache.layers)


class PreallocatedLayer(DynamicLayer):
    """One layer's keys and values in a buffer that grows by doubling; ``length`` marks the valid part.

    ``keys`` / ``values`` are views of the valid part made when read (moving the length, which every step
    does on every layer, then costs no tensor views: the bf16 kernels never read them)."""

    @property
    def keys(self) -> torch.Tensor | None:
        k = self.__dict__.get("_k")
        return self.__dict__.get("_keys") if k is None else k[..., : self.length, :]

    @keys.setter
    def keys(self, value: torch.Tensor | None) -> None:
        self.__dict__["_keys"] = value

    @property
    def values(self) -> torch.Tensor | None:
        v = self.__dict__.get("_v")
        return self.__dict__.get("_values") if v is None else v[..., : self.length, :]

    @values.setter
    def values(self, value: torch.Tensor | None) -> None:
        self.__dict__["_values"] = value

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.dtype, self.device = key_states.dtype, key_states.device
        self.length = 0
        self._k = self._alloc(key_states, _INITIAL_CAPACITY)
        self._v = self._alloc(value_states, _INITIAL_CAPACITY)
        self.is_initialized = True

    @staticmethod
    def _alloc(like: torch.Tensor, capacity: int) -> torch.Tensor:
        """Zeroed: slots never written hold finite values (a CUDA graph's step attends to the whole buffer under
        a mask, and a masked slot's weight 0 times a NaN left in fresh memory would be NaN)."""
        b, h, _, d = like.shape
        return like.new_zeros(b, h, capacity, d)

    def _reserve(self, end: int) -> None:
        capacity = self._k.shape[-2]
        if end <= capacity:
            return
        while capacity < end:
            capacity *= 2
        k, v = self._alloc(self._k, capacity), self._alloc(self._v, capacity)
        k[..., : self.length, :] = self._k[..., : self.length, :]
        v[..., : self.length, :] = self._v[..., : self.length, :]
        self._k, self._v = k, v

    def buffers(self, end: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The key and value buffers ``[kv_heads, capacity, d]`` with room for ``end`` positions (the bf16
        kernels write the new rows in place, then ``advance(end)``)."""
        self._reserve(end)
        return self._k[0], self._v[0]

    def advance(self, end: int) -> None:
        self._set_length(end)

    def _set_length(self, length: int) -> None:
        self.length = length

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        start = self.length
        end = start + key_states.shape[-2]
        self._reserve(end)
        self._k[..., start:end, :] = key_states
        self._v[..., start:end, :] = value_states
        self._set_length(end)
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.length if self.is_initialized else 0

    def crop(self, tokens_to_remove: int) -> None:
        if self.is_initialized and tokens_to_remove:
            self._set_length(max(0, self.length - abs(tokens_to_remove)))

    def truncate(self, length: int) -> None:
        if self.is_initialized:
            self._set_length(min(length, self.length))

    def compact(self, start: int, keep: torch.Tensor) -> None:
        """Move slots ``start + keep`` to ``start .. start + len(keep)`` and cut the rest."""
        if not self.is_initialized:
            return
        src = keep + start
        n = int(keep.numel())
        self._k[..., start : start + n, :] = self._k.index_select(-2, src)
        self._v[..., start : start + n, :] = self._v.index_select(-2, src)
        self._set_length(start + n)

    def reset(self) -> None:
        if self.is_initialized:
            self._set_length(0)


@contextmanager
def capture_lm_head_input(model):
    """Record the input of ``model``'s LM head (the last hidden states of the rows whose logits it returns)."""
    box: list[torch.Tensor] = []
    handle = model.get_output_embeddings().register_forward_pre_hook(lambda module, args: box.append(args[0]))
    try:
        yield box
    finally:
        handle.remove()


@contextmanager
def capture_layer_inputs(model, layers: Sequence[int]):
    """Record the inputs (hidden states) of ``model``'s decoder layers ``layers``, in that order."""
    blocks = model.get_decoder().layers
    box: list[torch.Tensor | None] = [None] * len(layers)

    def hook(i):
        def pre(module, args, kwargs):
            box[i] = args[0] if args else kwargs["hidden_states"]

        return pre

    handles = [blocks[layer].register_forward_pre_hook(hook(i), with_kwargs=True) for i, layer in enumerate(layers)]
    try:
        yield box
    finally:
        for h in handles:
            h.remove()


class CachedModel:
    """A causal LM with its own KV cache, used at batch size 1.

    Invariant kept by every method: the cache holds a prefix of the current context (usually all
    but its last token), ``length`` says how much. ``forwards`` counts forward passes after prefill.

    Llama-family models run through ``fast_forward.LeanForward`` (same operations, less per-call
    machinery) unless ``lean=False`` or ``PIPELINE_LEAN_FORWARD=0``; others through ``model(...)``.
    With ``capture_hidden`` set, ``hidden`` holds the LM head's input rows of the last forward
    ``[rows, hidden_size]`` (Medusa heads read them). With ``capture_layers`` (decoder layer indices,
    e.g. EAGLE-3's 2, L/2, L-3) ``hidden`` is instead the concatenation of those layers' inputs
    ``[rows, len(layers) * hidden_size]`` (the lean forward taps them, on the CPU kernels too, so the rows stay
    batch-invariant there; otherwise transformers' forward with hooks on the layers), and ``final_hidden`` the
    LM head's input rows of that forward.
    """

    def __init__(self, model, vocab_size: int | None = None, lean: bool = True) -> None:
        self.model = model
        self.lean = lean_forward_for(model) if lean else None
        self.capture_hidden = False
        self.capture_layers: tuple[int, ...] = ()
        self.hidden: torch.Tensor | None = None
        self.final_hidden: torch.Tensor | None = None
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        config = model.config
        self.max_positions = getattr(config, "max_position_embeddings", None)
        self.token_map = token_map_of(model)
        own_vocab = config.vocab_size if self.token_map is None else int(self.token_map.max()) + 1
        self.vocab_size = max(vocab_size or own_vocab, own_vocab)
        self._own_vocab = config.vocab_size
        if self.token_map is not None:
            self.token_map = self.token_map.to(self.device)
        self.forwards = 0
        self.prefill_s = 0.0
        self.cache = Cache(layer_class_to_replicate=PreallocatedLayer)
        self.reset()

    def reset(self) -> None:
        """Empty the cache and the forward counter (start of a new generation). The layers' buffers stay:
        allocated once (and grown by doubling), not again for every generation; but buffers made under
        ``torch.inference_mode`` (e.g. by a cost probe) cannot be written outside it: those are made anew."""
        if not torch.is_inference_mode_enabled() and self._inference_buffers():
            self.cache = Cache(layer_class_to_replicate=PreallocatedLayer)
        else:
            self.cache.reset()  # PreallocatedLayer.reset: length 0, buffers kept
        self.forwards = 0
        self.prefill_s = 0.0

    def _inference_buffers(self) -> bool:
        """Whether the cache's buffers are inference tensors (made under ``torch.inference_mode``)."""
        first = self.cache.layers[0].__dict__.get("_k") if self.cache.layers else None
        return first is not None and first.is_inference()

    @property
    def length(self) -> int:
        return self.cache.get_seq_length()

    def _ids(self, tokens: Sequence[int] | torch.Tensor) -> torch.Tensor:
        if isinstance(tokens, torch.Tensor):
            return tokens.to(self.device, torch.long).reshape(1, -1)
        return torch.tensor([list(tokens)], dtype=torch.long, device=self.device)

    def logits(self, logits: torch.Tensor) -> torch.Tensor:
        """The model's raw LM-head rows as fp32 logits over the target vocabulary: a restricted or smaller draft head's
        rows get -inf elsewhere (what every caller that runs the model's rows itself reads: drafting, tree
        forwards, beam sampling, the loop)."""
        logits = logits.float()
        if self.token_map is not None:
            full = logits.new_full((*logits.shape[:-1], self.vocab_size), float("-inf"))
            return full.index_copy_(-1, self.token_map, logits)
        if logits.shape[-1] < self.vocab_size:
            pad = logits.new_full((*logits.shape[:-1], self.vocab_size - logits.shape[-1]), float("-inf"))
            return torch.cat([logits, pad], -1)
        if logits.shape[-1] > self.vocab_size:
            return logits[..., : self.vocab_size]
        return logits

    def _run(self, ids: torch.Tensor, keep: int, **tree) -> torch.Tensor:
        """One forward of ``ids`` [1, n] after the cache; the last ``keep`` logit rows (0 = all), [1, rows, V]."""
        capture: list[torch.Tensor] | None = [] if self.capture_hidden else None
        if self.lean is not None:  # positions None: a causal chain after the cache
            layers = self.capture_layers if capture is not None else ()
            logits = self.lean(
                ids, self.cache, tree.get("position_ids"), tree.get("attention_mask"), keep, capture, layers
            )
            if capture is not None:
                self.final_hidden = capture[0][0]
                self.hidden = capture[-1][0]
            return logits
        if capture is not None and self.capture_layers:
            with capture_layer_inputs(self.model, self.capture_layers) as taps:
                logits = self.model(
                    input_ids=ids, past_key_values=self.cache, use_cache=True, logits_to_keep=max(keep, 0), **tree
                ).logits
            rows = ids.shape[1] if keep <= 0 else keep
            self.hidden = torch.cat([t[0, -rows:] for t in taps], -1)
            return logits
        if capture is not None:
            with capture_lm_head_input(self.model) as capture:
                logits = self.model(
                    input_ids=ids, past_key_values=self.cache, use_cache=True, logits_to_keep=keep, **tree
                ).logits
        else:
            logits = self.model(
                input_ids=ids, past_key_values=self.cache, use_cache=True, logits_to_keep=keep, **tree
            ).logits
        if capture is not None:
            self.hidden = capture[-1][0]
        return logits

    def _clock(self) -> float:
        """``perf_counter`` after the device's queued work (prefill times are wall times)."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter()

    def prefill(self, tokens: Sequence[int] | torch.Tensor) -> None:
        """Write ``tokens`` into the cache without counting a step or keeping logits (its wall time
        adds to ``prefill_s``, which ``reset`` zeroes: a generation's time to its first forward step)."""
        if len(tokens) == 0:
            return
        t0 = self._clock()
        self._run(self._ids(tokens), keep=1)
        self.prefill_s += self._clock() - t0

    def prefill_hidden(self, tokens: Sequence[int] | torch.Tensor) -> torch.Tensor:
        """Write ``tokens`` into the cache (no step counted) and return their last hidden states
        ``[n, hidden]`` (the LM head's input; the head itself is skipped on the lean path)."""
        if len(tokens) == 0:
            width = self.model.config.hidden_size * max(1, len(self.capture_layers))
            return torch.zeros(0, width, device=self.device, dtype=self.dtype)
        t0 = self._clock()
        with self.capturing():
            self._run(self._ids(tokens), keep=-1 if (self.lean is not None) else 0)
        self.prefill_s += self._clock() - t0
        return self.captured()

    @contextmanager
    def capturing(self) -> Iterator["CachedModel"]:
        """The forwards inside run with ``capture_hidden`` set (``captured()`` reads their hidden states after);
        the setting is restored on the way out."""
        saved = self.capture_hidden
        self.capture_hidden = True
        try:
            yield self
        finally:
            self.capture_hidden = saved

    def captured(self) -> torch.Tensor:
        """``hidden``, of the last forward, which ran with ``capture_hidden`` set."""
        assert self.hidden is not None, "no hidden states captured: set capture_hidden before the forward"
        return self.hidden

    def forward(self, tokens: Sequence[int] | torch.Tensor, keep: int = 1) -> torch.Tensor:
        """Append ``tokens`` (a causal chain after the cache) and return the last ``keep`` logit rows."""
        logits = self._run(self._ids(tokens), keep=keep)
        self.forwards += 1
        return self.logits(logits[0])

    def forward_raw(self, tokens: Sequence[int] | torch.Tensor, keep: int = 1) -> torch.Tensor:
        """``forward`` without the conversion to the target vocabulary: the last ``keep`` rows of this model's own
        head ``[keep, V_own]`` (``logits`` or ``top_k_rows`` convert them), as ``forward_masked_rows`` gives a
        packed step's (the chain loop's one-sequence cache, ``packed.SoloCache``)."""
        logits = self._run(self._ids(tokens), keep=keep)
        self.forwards += 1
        return logits[0]

    def forward_sparse(self, tokens: Sequence[int] | torch.Tensor, warper) -> tuple[torch.Tensor, torch.Tensor]:
        """Append ``tokens`` (a causal chain) and warp the last row with a top-k ``warper`` on this model's
        own head: ``(ids, probs)``, the target-vocabulary ids of the kept tokens and their warped
        probabilities. The same distribution as ``warper(self.forward(tokens)[-1])`` (whose other entries
        are 0) without building and sorting the full-vocabulary row: a restricted draft head stays small."""
        logits = self._run(self._ids(tokens), keep=1)[0, -1]
        self.forwards += 1
        return self.top_k_rows(logits, warper)

    def fused_chain(
        self, tokens: Sequence[int] | torch.Tensor, gamma: int, warper, generator
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
        """``gamma`` tokens sampled after ``tokens`` (a causal chain after the cache) from this model's top-k
        warped rows, as ``gamma`` rounds of ``forward_sparse`` + ``sample_sparse`` would draw them, in one call
        of the bf16 kernels: ``(tokens [gamma], index [gamma, k], probs [gamma, k])``; None where the kernels
        cannot (then take the steps one by one). Counts ``gamma`` forwards; the cache then also holds
        ``tokens`` and the first ``gamma - 1`` drawn tokens."""
        if (
            self.lean is None
            or self.capture_hidden
            or not self.lean.can_fuse_chain()
            or not warper.sparse(self.vocab_size)
        ):
            return None
        out = self.lean.fused_chain(
            self._ids(tokens)[0], self.cache, gamma, warper, self.token_map, self.vocab_size, generator
        )
        self.forwards += gamma
        return out

    def top_k_rows(self, logits: torch.Tensor, warper) -> tuple[torch.Tensor, torch.Tensor]:
        """Rows of this model's own-head logits ``[..., V_own]`` warped by a top-k ``warper``, as
        ``(ids, probs)`` over the target vocabulary (``forward_sparse``)."""
        if self.token_map is None and logits.shape[-1] > self.vocab_size:
            logits = logits[..., : self.vocab_size]
        index, probs = warper.top_k_rows(logits)
        return (index if self.token_map is None else self.token_map[index]), probs

    def forward_tree(
        self, tokens: torch.Tensor, positions: torch.Tensor, node_mask: torch.Tensor, tree_start: int, warper=None
    ):
        """Append tree nodes and return the logits of every one of them (with a top-k ``warper``: their
        warped rows as ``(ids, probs)``, as ``forward_sparse``).

        ``tree_start`` is the cache length where the tree's first node lives; every node sees the
        whole cache before it, and ``node_mask[i, j]`` says whether new node i sees tree node j
        (columns cover all tree nodes, the new ones included). ``positions`` are absolute positions.
        """
        n = tokens.numel()
        allowed = torch.ones(n, self.length + n, dtype=torch.bool, device=self.device)
        allowed[:, tree_start:] = node_mask.to(self.device)
        return self.forward_masked(tokens, positions, allowed, warper=warper)

    def forward_masked(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        allowed: torch.Tensor,
        keep: int = 0,
        warper=None,
        raw: bool = False,
    ):
        """Append ``tokens`` [n] at absolute ``positions`` [n], row i seeing exactly the slots ``allowed[i]``
        (bool ``[n, length + n]`` over the cache and the new rows): a tree after a shared prefix, or
        independent sequences packed into one cache (each row sees only its own sequence's slots). Returns
        the logits of the last ``keep`` rows (0 = all) over the target vocabulary, or with a top-k
        ``warper`` their warped rows as ``(ids, probs)``, as ``forward_sparse``; ``raw``: the rows of this model's
        own head, unconverted (``forward_raw``)."""
        n = tokens.numel()
        start = self.length
        allowed = allowed.to(self.device)
        if self.lean is not None:
            mask = allowed  # the lean forward takes the boolean form as it is
        else:
            mask = torch.zeros(allowed.shape, dtype=self.dtype, device=self.device)
            mask.masked_fill_(~allowed, torch.finfo(self.dtype).min)
        tree = {
            "attention_mask": mask[None, None],
            "position_ids": positions.to(self.device, torch.long).reshape(1, -1),
        }
        if self.lean is None:  # transformers' forward needs it (the lean one ignores it)
            tree["cache_position"] = torch.arange(start, start + n, device=self.device)
        logits = self._run(self._ids(tokens), keep=keep, **tree)
        self.forwards += 1
        if raw:  # this model's own head rows (``packed.SoloCache``'s tree rows)
            return logits[0]
        return self.logits(logits[0]) if warper is None else self.top_k_rows(logits[0], warper)

    def forward_masked_rows(
        self, tokens: torch.Tensor, positions: torch.Tensor, allowed: torch.Tensor, rows: torch.Tensor
    ) -> torch.Tensor:
        """``forward_masked`` with the LM head run on the rows ``rows`` [r] alone: their logits ``[r, V_own]`` in
        this model's own head and dtype (``logits`` or ``top_k_rows`` turns them into the target vocabulary).
        Several sequences packed into one step (a prompt and a few draft tokens each) need one or a few rows
        per sequence; the head over every row would cost more than the decoder layers (a 49k vocabulary)."""
        n = tokens.numel()
        start = self.length
        allowed = allowed.to(self.device)
        rows = rows.to(self.device)
        if self.lean is not None:
            with self.capturing():
                self._run(
                    self._ids(tokens),
                    keep=-1,
                    attention_mask=allowed[None, None],
                    position_ids=positions.to(self.device, torch.long).reshape(1, -1),
                )
            self.forwards += 1
            assert self.final_hidden is not None  # captured by the forward above
            return self.lean.head(self.final_hidden[rows][None])[0]
        mask = torch.zeros(allowed.shape, dtype=self.dtype, device=self.device)
        mask.masked_fill_(~allowed, torch.finfo(self.dtype).min)
        logits = self._run(
            self._ids(tokens),
            keep=0,
            attention_mask=mask[None, None],
            position_ids=positions.to(self.device, torch.long).reshape(1, -1),
            cache_position=torch.arange(start, start + n, device=self.device),
        )
        self.forwards += 1
        return logits[0][rows]

    def rollback(self, length: int) -> None:
        """Keep only the first ``length`` cached positions (no copy)."""
        for layer in preallocated_layers(self.cache):
            layer.truncate(length)

    def compact(self, start: int, keep: torch.Tensor | Sequence[int]) -> None:
        """Keep the cached slots ``start + keep`` (e.g. an accepted tree path) right after ``start``."""
        keep = torch.as_tensor(keep, dtype=torch.long, device=self.device)
        for layer in preallocated_layers(self.cache):
            layer.compact(start, keep)
