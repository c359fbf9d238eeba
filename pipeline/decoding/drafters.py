"""Drafters: what proposes tokens, separated from how the target verifies them; one plugin per kind.

One interface for chains and trees (after transformers' ``CandidateGenerator`` and vLLM's ``v1/spec_decode``
proposers):

- ``start(prompt, hidden)``: a new generation; the target has cached ``prompt[:-1]`` and, for a
  drafter that reads them (``uses_hidden``), passes its hidden states of those positions;
- ``propose(context, gamma, warper, generator) -> ChainDraft | None``: a chain proposal, up to ``gamma``
  tokens after ``context`` with the warped draft rows q they were drawn from, dense ``[g, V]``, or no rows for
  a deterministic proposal (n-gram lookup, which draws nothing: each q is the point mass at its token, which
  the rules take as such, ``ChainRule.point_mass``); None: nothing to propose, the decoder takes a plain
  target step;
- ``propose_tree(context, k_config, warper, generator, children) -> TokenTree | None``: a tree proposal
  where the drafter can make one (``shapes`` holds ``tree``), ``k_config[d]`` children under each
  depth-d node drawn as the method's walk needs (``children``: ``iid`` from q, ``distinct`` from q
  without replacement, or the ``top`` k; ``tree_children`` says which the drafter can draw);
- ``feedback(length, kept, hidden, tree, path)``: after each verification, how many draft positions
  the target kept after ``length`` context tokens (the chain's prefix, or ``path`` of ``tree``) and,
  for a drafter that reads them, the target's hidden states of the root and the kept positions: the
  drafter rolls back, compacts or adapts;
- ``stop``: set by the decoder (``draft_stop: confidence``, ``draft_length.py``): ``stop(q_row, token)`` after
  each draft says to end the chain there; a drafter may honour it inside its own loop (the draft model's chain
  does), and the decoder cuts any longer chain after the fact, so a drafter may also ignore it;
- ``slots(n)``, ``propose_chains(asks, warper)``, ``propose_trees(asks, warper, children)``, ``finish()``: the
  loop's (``batched.py``) per-request drafters (this one at batch 1, ``fork`` copies above; the draft model's share
  one packed cache), every live request's chain or tree at once (default: each drafter's ``propose`` or
  ``propose_tree``; the draft model drafts them together, one forward per draft position or tree level,
  ``drafting.draft_chain``, ``tree_verify.draft_trees``), and a request's end;
- ``forwards``: draft forward passes of the current generation.

What a drafter costs is measured by the loop that calls it (``phase_clock``: the draft phase of each iteration, its
proposal and its feedback), never by the drafter itself, and the bench's transformers peers are the bench's
declarations (``pipeline.bench.peers``): neither is part of the contract.

A plugin (a ``Drafter`` subclass in the registry ``DRAFTERS``) declares its ``kind``, its capabilities
(``shapes``, ``tree_children``, the ``asset`` the pair must offer, ``uses_hidden``), its own parameters
(``params``: its configuration scope, ``drafter: {kind: ngram, max_ngram: 3}``), checks them against what the
pair offers before any model loads (``check``) and builds itself over the decoder's models and assets
(``create``). A drafter of your own is named ``drafter: {kind: mypkg.drafts:MyDrafter, ...}``
(docs/extending.md). Which methods take which drafter follows from the capabilities (``Decoder.accepts``): a
chain method takes every drafter with chain proposals, a tree method every drafter that draws the children its
walk needs. ``drafter_scope.resolve_drafter`` turns a method's ``drafter`` value into a resolved scope (the short
forms, ``pair``, a drafter's parameters: ``drafter_scope.py``).

- ``model``: a draft model (chains and sampled trees; ``ModelDrafter``);
- ``eagle``: an EAGLE-1/2 head on the target's last hidden states (``pipeline.decoding.eagle``; the drafter
  in ``eagle_drafters.py``);
- ``eagle3``: an EAGLE-3 head on three target layers' inputs (``pipeline.decoding.eagle3``);
  ``drafter: eagle`` with an EAGLE-3 folder resolves to ``eagle3``;
- ``ngram``: prompt lookup (Saxena 2023; transformers' ``PromptLookupCandidateGenerator``, vLLM's
  ``NgramProposer``): the continuation of the most recent earlier occurrence of the last n tokens
  in prompt + output, n from ``max_ngram`` down to ``min_ngram``. No model, no training; the draft
  is deterministic (q a point mass, carried as no rows), so token and block verification stay exact;
- ``medusa``: the pair's Medusa heads (``pipeline.decoding.medusa_heads``): a Cartesian tree of their
  top-k from the target's hidden state at the last accepted token.
"""

from __future__ import annotations

from typing import Any, Callable, ClassVar

import torch

from .base import Param, int_at_least
from .beam_sampling import Beam, draft_beams
from .drafter_context import DrafterContext
from .drafting import ChainAsk, ChainDraft, TreeAsk, draft_chain
from .kv import CachedModel
from .medusa_heads import missing_medusa_heads
from .packed import Lanes, PackedCache, SoloCache
from .tree import TokenTree
from .tree_verify import cartesian_tree, draft_trees
from .warping import Warper

TREE_CHILDREN = (
    "iid",
    "distinct",
    "top",
)  # how a tree's children are drawn: i.i.d. from q, from q without replacement, the top k


class Drafter:
    """A drafter plugin: its kind, capabilities, parameters, checks, how it is built, and the drafting interface."""

    kind: ClassVar[str] = ""
    params: ClassVar[dict[str, Param]] = {}
    shapes: ClassVar[frozenset[str]] = frozenset({"chain"})  # the proposals it makes: chain, tree
    tree_children: ClassVar[frozenset[str]] = frozenset()  # how it can draw a tree's children (TREE_CHILDREN)
    asset: ClassVar[str | None] = None  # what the pair must offer: draft, eagle, medusa (None: nothing)
    # what the asset's pair config key holds (a key of its own beside target and draft: models.pair_attachments)
    asset_help: ClassVar[str] = ""
    uses_hidden: ClassVar[bool] = False  # it reads the target's hidden states (start, feedback)
    prompt_hidden: ClassVar[bool] = True  # ... of the prompt too (with uses_hidden)
    # drafts for several requests at once (decoding/batched.py): the draft model in the packed cache, or a drafter
    # whose ``propose`` / ``propose_tree`` is called per request on its own copy (``fork``: n-gram lookup, the EAGLE
    # heads, the Medusa heads)
    batchable: ClassVar[bool] = False
    # it drafts a method's beams (``propose_beams``: MTAD's beam sampling; the draft model)
    beams: ClassVar[bool] = False
    # its chain takes a method's ``admit`` (asked before each draw, a refusal ends the chain: BiLD's confidence) and
    # ``stop`` in place of its own (``propose_chains``; the draft model)
    admits: ClassVar[bool] = False
    # the confidence stop of draft_stop: confidence (None: draft gamma tokens), set by the decoder
    stop: Callable[[torch.Tensor, torch.Tensor], bool] | None = None

    @classmethod
    def check(cls, method: str, scope: dict[str, Any], ctx: DrafterContext) -> None:
        """Checks against what the pair offers (before any model loads); ValueError names the fix."""

    @classmethod
    def create(cls, decoder, scope: dict[str, Any]) -> "Drafter":
        raise NotImplementedError

    def start(self, prompt: list[int], hidden: torch.Tensor | None = None) -> None:
        raise NotImplementedError

    def propose(self, context: list[int], gamma: int, warper: Warper, generator) -> ChainDraft | None:
        raise NotImplementedError

    def fork(self) -> "Drafter":
        """A drafter for another sequence decoding beside this one's (the batched engine gives each slot its own):
        the same weights, its own per-sequence state. Default: this drafter itself (one that keeps no state
        between ``start`` and the end of a generation that another sequence's calls could disturb)."""
        return self

    def slots(self, n: int) -> list["Drafter"]:
        """The drafters of ``n`` requests decoding together (the loop's slots, ``decoding/batched.py``):
        this drafter itself at batch 1, else ``n`` forks."""
        return [self] if n == 1 else [self.fork() for _ in range(n)]

    @property
    def max_depth(self) -> int | None:
        """The most tree levels it can draft (None: as many as asked; Medusa: its heads)."""
        return None

    def propose_chains(
        self,
        asks: list[ChainAsk],
        warper: Warper,
        *,
        admit: Callable[[torch.Tensor, torch.Tensor | None], bool] | None = None,
        stop: Callable[[torch.Tensor, torch.Tensor], bool] | None = None,
    ) -> list[ChainDraft | None]:
        """The chains of several requests (each ask with its own drafter of ``slots``; called on one of them): by
        default each drafter's ``propose``. A drafter that drafts them together overrides it (the draft model: one
        packed forward per draft position); one that declares ``admits`` takes a method's ``admit`` and ``stop``."""
        if admit is not None or stop is not None:
            raise ValueError(f"drafter {self.kind!r} takes no admit or stop of a method's own (it declares no admits)")
        return [a.drafter.propose(a.context, a.gamma, warper, a.generator) for a in asks]

    def propose_beams(
        self, asks: list[ChainAsk], warper: Warper, num_beams: int, beam_weights: str, replacement: bool
    ) -> list[Beam]:
        """Each ask's best of ``num_beams`` beams (drafters that declare ``beams``)."""
        raise NotImplementedError(f"drafter {self.kind!r} drafts no beams (it declares no beams)")

    def propose_trees(self, asks: list[TreeAsk], warper: Warper, children: str) -> list[TokenTree | None]:
        """The trees of several requests (the tree loop's step 1; each ask with its own drafter of ``slots``): by
        default each drafter's ``propose_tree``; the draft model draws them together (one packed forward per
        level)."""
        return [a.drafter.propose_tree(a.context, a.shape, warper, a.generator, children) for a in asks]

    def finish(self) -> None:
        """The request in this drafter's slot is done (a packed draft cache frees its sequence)."""

    def close(self) -> None:
        """The loop starts or ends a run over its slots (a packed draft cache is emptied)."""

    def propose_tree(
        self, context: list[int], k_config: list[int], warper: Warper, generator, children: str = "iid"
    ) -> TokenTree | None:
        """A tree of ``len(k_config)`` levels at most after ``context`` (drafters with ``tree`` in ``shapes``)."""
        raise NotImplementedError(f"drafter {self.kind!r} makes no tree proposals")

    def feedback(
        self,
        length: int,
        kept: int,
        hidden: torch.Tensor | None = None,
        tree: TokenTree | None = None,
        path: list[int] | None = None,
    ) -> None:
        """After a verification: the target kept ``kept`` draft positions after ``length`` context tokens (the
        chain's first ``kept``; for a tree, ``path``); ``hidden``: the target's hidden states of the root and
        the kept positions (``uses_hidden`` drafters). Default: roll back to what was kept."""
        self.rollback(length + kept)
        if hidden is not None:
            self.observe(hidden, length - 1)

    def observe(self, hidden: torch.Tensor, start: int) -> None:
        """The target's hidden states of positions ``start ..`` (ignored by drafters without features)."""

    def rollback(self, length: int) -> None:
        """Keep only what depends on the first ``length`` context tokens."""

    @property
    def forwards(self) -> int:
        return 0


class ModelDrafter(Drafter):
    """A draft model with its own KV cache (``CachedModel``): the pair's ``draft:``; chains and sampled trees."""

    kind = "model"
    shapes = frozenset({"chain", "tree"})
    tree_children = frozenset(TREE_CHILDREN)
    asset = "draft"
    batchable = True
    beams = True
    admits = True

    def __init__(self, draft: CachedModel, cache: Lanes | None = None, slot: int = 0) -> None:
        self.model = draft
        self.cache: Lanes = SoloCache(draft) if cache is None else cache  # its sequence(s): its own cache at batch 1
        self.slot = slot
        self.drafted = 0  # draft forwards of this slot's request in a packed cache

    @classmethod
    def create(cls, decoder, scope):
        if decoder.draft is None:
            raise ValueError(
                f"method {decoder.name!r} with drafter: model needs a draft model: pass draft=... to build_decoder"
            )
        return cls(decoder.draft)

    def slots(self, n: int) -> list[Drafter]:
        """Batch > 1: ``n`` drafters over one packed cache of the draft model (slot i: request i's sequence)."""
        if n == 1:
            return [self]
        packed = PackedCache(self.model)
        out: list[Drafter] = []
        for i in range(n):
            d = ModelDrafter(self.model, packed, i)
            d.stop = self.stop
            out.append(d)
        return out

    def start(self, prompt, hidden=None) -> None:
        self.drafted = 0
        self.cache.start({self.slot: prompt})  # batch 1: prefill prompt[:-1]; packed: it rides in the first step

    def propose(self, context, gamma, warper, generator):
        """The draft model's chain; ``stop`` ends it early token by token."""
        return self.propose_chains([ChainAsk(self.slot, context, gamma, generator, self)], warper)[0]

    def propose_chains(self, asks, warper, *, admit=None, stop=None):
        """``drafting.draft_chain`` over every ask's sequence at once (one draft forward per position); ``admit`` and
        ``stop`` (in place of ``self.stop``): a method's own run (BiLD's: confidence before each draw, EOS)."""
        chains = draft_chain(self.model, self.cache, asks, warper, self.stop if stop is None else stop, admit)
        for a, chain in zip(asks, chains):
            a.drafter.drafted += chain.forwards
        return chains

    def propose_beams(self, asks, warper, num_beams, beam_weights, replacement):
        """MTAD's draft: the best of ``num_beams`` beams of beam sampling per ask (``beam_sampling.draft_beams``,
        one draft forward per depth over every ask's sequence)."""
        beams = draft_beams(self.model, self.cache, asks, num_beams, warper, beam_weights, replacement)
        for a, beam in zip(asks, beams):
            a.drafter.drafted += len(beam.tokens)
        return beams

    def finish(self) -> None:
        self.cache.release(self.slot)

    def close(self) -> None:
        self.cache.close()

    def propose_tree(self, context, k_config, warper, generator, children="iid"):
        return self.propose_trees([TreeAsk(self.slot, context, list(k_config), generator, self)], warper, children)[0]

    def propose_trees(self, asks, warper, children):
        """``tree_verify.draft_trees`` over every ask's sequence at once (one draft forward per level)."""
        return list(draft_trees(self.model, self.cache, asks, warper, children))

    def feedback(self, length, kept, hidden=None, tree=None, path=None) -> None:
        if tree is None:
            self.rollback(length + kept)
        else:  # keep the accepted nodes the draft has cached (a prefix of the path: the fed ones)
            self.cache.keep_path(self.slot, length, [i for i in path or [] if i < tree.fed])

    def rollback(self, length: int) -> None:
        self.cache.rollback(self.slot, length)

    @property
    def forwards(self) -> int:
        """Draft forwards of the current generation (the model's own count at batch 1, trees included)."""
        return self.model.forwards if self.cache.solo else self.drafted


class MedusaDrafter(Drafter):
    """Medusa heads (``medusa_heads.py``, the decoder's asset ``medusa``): a Cartesian tree of the heads' top-k,
    read from the target's hidden state at the last accepted token (fed back after every verification). Nothing
    to propose before the first hidden state (the generation's first step is the target's own)."""

    kind = "medusa"
    shapes = frozenset({"tree"})
    tree_children = frozenset({"top"})
    asset = "medusa"
    asset_help = "a folder of Medusa heads for the target (pipeline.train_medusa)"
    uses_hidden = True
    prompt_hidden = False  # the heads read the last token's state, which the prompt's prefill does not give
    batchable = True  # one copy per batch slot (``fork``: its own last hidden row)

    def __init__(self, heads, lm_head) -> None:
        self.heads, self.lm_head = heads, lm_head
        self.head_row: torch.Tensor | None = None

    @classmethod
    def create(cls, decoder, scope):
        target = decoder.target.model
        heads = decoder.assets.get("medusa")
        if heads is None:
            raise ValueError(missing_medusa_heads(decoder.name))
        return cls(heads, target.get_output_embeddings())

    @property
    def max_depth(self) -> int | None:
        return int(self.heads.num_heads)

    def fork(self) -> "MedusaDrafter":
        return MedusaDrafter(self.heads, self.lm_head)

    def start(self, prompt, hidden=None) -> None:
        self.head_row = None

    def propose(self, context, gamma, warper, generator):
        raise NotImplementedError("Medusa heads draft trees (a chain method cannot use them)")

    def propose_tree(self, context, k_config, warper, generator, children="top"):
        if self.head_row is None:
            return None
        depth = min(len(k_config), self.heads.num_heads)
        head_logits = self.heads(self.head_row, self.lm_head)  # [K, V]
        return cartesian_tree(head_logits[:depth], list(k_config[:depth]), len(context))

    def feedback(self, length, kept, hidden=None, tree=None, path=None) -> None:
        self.head_row = hidden[-1]  # the target's state at the last kept token (row 0: the root's)


class NgramDrafter(Drafter):
    """Prompt lookup: the continuation of the most recent earlier match of the context's last n tokens."""

    kind = "ngram"
    batchable = True
    params = {
        "max_ngram": Param(3, int_at_least(1), "longest suffix looked up"),
        "min_ngram": Param(1, int_at_least(1), "shortest suffix looked up"),
    }

    def __init__(self, device, max_ngram: int = 3, min_ngram: int = 1) -> None:
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
        self.device = device
        self.max_ngram, self.min_ngram = max_ngram, min_ngram
        self.lookups = 0

    @classmethod
    def check(cls, method, scope, ctx) -> None:
        if scope["min_ngram"] > scope["max_ngram"]:
            raise ValueError(
                f"method {method!r}: drafter ngram min_ngram ({scope['min_ngram']}) "
                f"must be <= max_ngram ({scope['max_ngram']})"
            )

    @classmethod
    def create(cls, decoder, scope):
        return cls(decoder.target.device, scope["max_ngram"], scope["min_ngram"])

    def start(self, prompt, hidden=None) -> None:
        self.lookups = 0

    def lookup(self, context: list[int], gamma: int) -> list[int]:
        """The draft tokens (possibly fewer than ``gamma``; empty when nothing matches)."""
        L = len(context)
        ctx = torch.tensor(context, dtype=torch.long)
        for n in range(min(self.max_ngram, L - 1), self.min_ngram - 1, -1):
            windows = ctx[: L - 1].unfold(0, n, 1)  # windows starting at 0 .. L-1-n, all ending before the last token
            hits = (windows == ctx[L - n :]).all(-1).nonzero()
            if hits.numel():
                start = int(hits[-1]) + n  # the most recent match
                return context[start : start + gamma]
        return []

    def propose(self, context, gamma, warper, generator):
        self.lookups += 1
        tokens = self.lookup(context, gamma)
        if not tokens:
            return None
        # a deterministic proposal: no rows (each is the point mass at its token; ChainDraft.probs None)
        return ChainDraft(torch.tensor(tokens, dtype=torch.long, device=self.device), None)
