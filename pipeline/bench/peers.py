"""The bench's transformers peers: for a drafter kind, the transformers assisted generation that drafts the same
way (the bench's ``transformers`` rows beside ours, ``runners.Bench.transformers``).

A peer is the bench's own declaration, registered here beside the drafters' registrations and read only by the
bench: the drafter contract (``pipeline.decoding.drafters.Drafter``) holds what drafting needs and nothing about
transformers. A drafter kind without a registered peer gets no transformers row (``no_peer`` says why). A
drafter of your own with a transformers equivalent registers a ``Peer`` in ``PEERS`` under its kind.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from pipeline.registry import Registry


@dataclass(frozen=True)
class PeerArgs:
    """What a peer's ``generate`` keywords are made of: the pair's draft model, the chain length (spd's gamma)
    and prompt lookup's longest n-gram (spd's ``max_ngram``)."""

    draft: Any
    gamma: int
    max_ngram: int


@dataclass(frozen=True)
class Peer:
    """transformers' equivalent of drafter ``drafter``: the keywords its ``generate`` takes (``kwargs``) and
    whether it needs the draft model's full-vocabulary head (transformers compares the draft's and the target's
    logits over one vocabulary)."""

    drafter: str
    kwargs: Callable[[PeerArgs], dict[str, Any]]
    full_vocab_draft: bool = False


PEERS: Registry[Peer] = Registry("transformers peer", name_of=lambda p: p.drafter)

# The method a peer runs as: transformers' assisted generation verifies a chain by token verification (Leviathan
# et al.), our `spd`. Its rows are labelled with it, run at its gamma and its `max_ngram`, and compared with our
# rows of each drafter; the bench's per-drafter costs and its roofline line are taken under it too.
REFERENCE = "spd"


def assistant_model(a: PeerArgs) -> dict[str, Any]:
    """Assisted generation with the pair's draft model, a constant ``gamma`` tokens per step, no confidence stop."""
    if a.draft is None:
        raise ValueError("transformers' assisted generation with the draft model needs one: the pair has no draft")
    a.draft.generation_config.num_assistant_tokens = a.gamma
    a.draft.generation_config.num_assistant_tokens_schedule = "constant"
    a.draft.generation_config.assistant_confidence_threshold = 0.0
    return {
        "assistant_model": a.draft,
        "num_assistant_tokens": a.gamma,
        "num_assistant_tokens_schedule": "constant",
        "assistant_confidence_threshold": 0.0,
    }


def prompt_lookup(a: PeerArgs) -> dict[str, Any]:
    """transformers' ``PromptLookupCandidateGenerator``: ``gamma`` tokens after a match of up to ``max_ngram``."""
    return {"prompt_lookup_num_tokens": a.gamma, "max_matching_ngram_size": a.max_ngram}


PEERS.register(Peer("model", assistant_model, full_vocab_draft=True))
PEERS.register(Peer("ngram", prompt_lookup))


def no_peer(drafter: str) -> str:
    """Why drafter ``drafter`` has no transformers row."""
    return (
        f"transformers' assisted generation has no equivalent of drafter {drafter} "
        f"(it drafts with: {', '.join(f'drafter {p}' for p in PEERS)})"
    )
