"""Exact laws and expected acceptance of every verification rule, by enumeration (numbers only, no models).

Given target and draft conditionals over a small vocabulary (``Pair``: functions of the prefix drafted so
far in the iteration), ``evaluate`` enumerates every draft (chain or tree, drawn as the methods draw them)
and every random outcome of the rule, and returns the law of the iteration's output, the law of the number
of accepted drafts, the expected accepted drafts and emitted tokens per iteration, and the total variation
distance between the output law (continued by the target to a common length) and the target's.

The rules run through the SAME functions the engine calls: chain rules are called with representative
uniforms inside every cell of an exact case split of their thresholds (a uniform below / above each
threshold, weighted by the cell's probability); rules that flip coins (``traversal_walk``) are re-run once
per sequence of coin outcomes; SpecInfer / MCSS / SpecTr walk the tree with the engine's per-node acceptance
functions (``multi_candidate_acceptance``, ``kseq_acceptance``) in the order ``tree_verify``'s walks use.
Float64 throughout; ``python -m pipeline.exact`` prints the table (docs/ALGORITHMS.md section 20).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TypeVar

import torch

from .base import METHODS, validate_params
from .exact_table import as_fraction, format_table  # noqa: F401 - re-exported (the CLI and tests read them here)
from .hsd_verify import hsd_verify, hsd_weights
from .traversal_verify import traversal_walk
from .tree import TokenTree
from .verification import (
    block_verify,
    block_weights,
    kseq_acceptance,
    mtad_verify,
    multi_candidate_acceptance,
    token_acceptance,
    token_verify,
)

DT = torch.float64
Prefix = tuple[int, ...]
Law = dict[Prefix, float]


def chain_rules() -> list[str]:
    """The methods whose chain rule declares its exact case analysis (``ChainRule.exact``), in registration order."""
    return METHODS.names(where=lambda cls: cls.rule is not None and cls.rule.exact is not None)


def tree_rules() -> list[str]:
    """The methods whose tree walk declares its exact case analysis (``TreeWalk.exact``), in registration order."""
    return METHODS.names(where=lambda cls: cls.walk is not None and cls.walk.exact is not None)


def lossless(rule: str) -> bool:
    """Whether the method ``rule`` is lossless at its defaults (its ``Capabilities``, with a draft model)."""
    return validate_params(METHODS[rule], {}, has_draft=True).capabilities.lossless


class Pair:
    """Target and draft conditionals over ``vocab`` tokens: ``target(prefix)`` and ``draft(prefix)`` are rows
    ``[vocab]`` (float64, summing to 1) after the tokens ``prefix`` of the current iteration; rows are cached."""

    def __init__(
        self, target: Callable[[Prefix], torch.Tensor], draft: Callable[[Prefix], torch.Tensor], vocab: int
    ) -> None:
        self.vocab = vocab
        self._fns = {"target": target, "draft": draft}
        self._cache: dict[tuple[str, Prefix], torch.Tensor] = {}

    def _row(self, which: str, prefix: Prefix) -> torch.Tensor:
        key = (which, prefix)
        if key not in self._cache:
            row = torch.as_tensor(self._fns[which](prefix), dtype=DT)
            if row.shape != (self.vocab,) or (row < 0).any() or abs(float(row.sum()) - 1.0) > 1e-9:
                raise ValueError(
                    f"the {which} row after {prefix} must be {self.vocab} non-negative numbers summing to 1, "
                    f"got {row.tolist()}"
                )
            self._cache[key] = row
        return self._cache[key]

    def target(self, prefix: Prefix) -> torch.Tensor:
        return self._row("target", tuple(prefix))

    def draft(self, prefix: Prefix) -> torch.Tensor:
        return self._row("draft", tuple(prefix))

    @classmethod
    def context_free(cls, p, q) -> Pair:
        """The same rows p (target) and q (draft) after every prefix."""
        p, q = torch.as_tensor(p, dtype=DT), torch.as_tensor(q, dtype=DT)
        if p.shape != q.shape or p.dim() != 1:
            raise ValueError(f"p and q must be two rows over one vocabulary, got {len(p)} and {len(q)} numbers")
        return cls(lambda _: p, lambda _: q, p.shape[0])

    @classmethod
    def random(cls, vocab: int, seed: int, zeros: float = 0.25) -> Pair:
        """Random conditionals that depend on the prefix (each row its own draw, reproducible from ``seed``);
        about ``zeros`` of the entries are 0, so supports differ (never the whole row)."""

        def make(which: int) -> Callable[[Prefix], torch.Tensor]:
            def row(prefix: Prefix) -> torch.Tensor:
                index = sum((t + 1) * (vocab + 1) ** i for i, t in enumerate(prefix))
                gen = torch.Generator().manual_seed(seed * 1_000_003 + index * 2 + which)
                w = torch.rand(vocab, generator=gen, dtype=DT) ** 3
                w = w * (torch.rand(vocab, generator=gen, dtype=DT) >= zeros)
                if w.sum() == 0:
                    w[int(torch.randint(vocab, (1,), generator=gen))] = 1.0
                return w / w.sum()

            return row

        return cls(make(0), make(1), vocab)


def sequence_law(pair: Pair, length: int, which: str = "target") -> Law:
    """The law of the first ``length`` tokens under the target (or the draft)."""
    row = pair.target if which == "target" else pair.draft
    law: Law = {(): 1.0}
    for _ in range(length):
        law = {
            s + (v,): pr * float(r[v]) for s, pr in law.items() for r in [row(s)] for v in range(pair.vocab) if r[v] > 0
        }
    return law


def prefix_bound(pair: Pair, gamma: int) -> float:
    """``sum_{k=1..gamma} (1 - TV(P_k, Q_k))`` over the target's and the draft's laws of k-token prefixes: no
    lossless rule that sees one draft chain accepts more drafts per iteration in expectation (Block
    Verification, Theorem 2; the issue's bound)."""
    total = 0.0
    for k in range(1, gamma + 1):
        P, Q = sequence_law(pair, k), sequence_law(pair, k, "draft")
        total += sum(min(pr, Q.get(s, 0.0)) for s, pr in P.items())
    return total


def total_variation(a: Law, b: Law) -> float:
    return 0.5 * sum(abs(a.get(s, 0.0) - b.get(s, 0.0)) for s in set(a) | set(b))


@dataclass
class Outcome:
    """One rule on one pair: ``law`` is the output's first ``horizon`` tokens (the iteration's tokens continued
    by the target), ``emitted`` the law of the iteration's own tokens, ``accepted_law`` of its accepted drafts."""

    rule: str
    horizon: int
    law: Law = field(default_factory=dict)
    emitted: Law = field(default_factory=dict)
    accepted_law: dict[int, float] = field(default_factory=dict)
    distance: float = 0.0  # TV(law, target's law of horizon tokens)
    bound: float | None = None  # the single-draft bound (chain rules)

    @property
    def accepted(self) -> float:
        return sum(n * pr for n, pr in self.accepted_law.items())

    @property
    def tokens(self) -> float:
        return self.accepted + sum(self.accepted_law.values())

    @property
    def lossless(self) -> bool:
        return lossless(self.rule)


# ---------------------------------------------------------------------------------------------------
# Randomness by exact case analysis
# ---------------------------------------------------------------------------------------------------


def uniform_cases(thresholds: list[float]) -> Iterator[tuple[list[float], float]]:
    """Every cell of the split of independent uniforms at ``thresholds``: a representative value of each
    uniform (the middle of [0, t) or of (t, 1]) and the cell's probability; empty cells are left out."""
    options = []
    for t in thresholds:
        t = min(max(float(t), 0.0), 1.0)
        options.append([(v, w) for v, w in ((t / 2, t), ((1 + t) / 2, 1 - t)) if w > 0])
    for combo in itertools.product(*options):
        pr = 1.0
        for _, w in combo:
            pr *= w
        yield [v for v, _ in combo], pr


R = TypeVar("R")


def coin_cases(run: Callable[[Callable[[float], bool]], R]) -> list[tuple[float, R]]:
    """Every sequence of coin outcomes of ``run(coin)`` with its probability (``run`` re-executed per sequence;
    a coin of probability 0 or 1 does not branch)."""
    out: list[tuple[float, R]] = []
    pending: list[tuple[bool, ...]] = [()]
    while pending:
        script = pending.pop()
        taken: list[bool] = []
        weight = [1.0]

        def coin(prob: float, script=script, taken=taken, weight=weight) -> bool:
            prob = min(max(float(prob), 0.0), 1.0)
            i = len(taken)
            if i < len(script):
                choice = script[i]
            else:
                choice = prob > 0
                if 0 < prob < 1:
                    pending.append((*taken, False))
            weight[0] *= prob if choice else 1.0 - prob
            taken.append(choice)
            return choice

        result = run(coin)
        if weight[0] > 0:
            out.append((weight[0], result))
    return out


# ---------------------------------------------------------------------------------------------------
# Chain rules: every draft x ~ Q, every cell of the rule's uniforms
# ---------------------------------------------------------------------------------------------------


def token_cases(P: torch.Tensor, Q: torch.Tensor, x: torch.Tensor, **params):
    """Token verification (spd): a uniform below / above each acceptance threshold."""
    for u, pr in uniform_cases(token_acceptance(P, Q, x).tolist()):
        n, dist = token_verify(P, Q, x, torch.tensor(u, dtype=DT))
        yield pr, int(n), dist


def block_cases(P: torch.Tensor, Q: torch.Tensor, x: torch.Tensor, **params):
    """Block verification: one uniform against the block weights."""
    for eta, pr in uniform_cases(block_weights(P, Q, x)[0].tolist()):
        n, dist = block_verify(P, Q, x, torch.tensor(eta, dtype=DT))
        yield pr, int(n), dist


def _hsd_cases(capped: bool):
    def cases(P: torch.Tensor, Q: torch.Tensor, x: torch.Tensor, **params):
        h, full, _ = hsd_weights(P, Q, x, capped)
        for u, pr in uniform_cases([float(full), *h.tolist()]):
            n, dist = hsd_verify(P, Q, x, torch.tensor(u[0], dtype=DT), torch.tensor(u[1:], dtype=DT), capped)
            yield pr, int(n), dist

    return cases


hsd_cases = _hsd_cases(True)  # hsd: the cap on the whole draft too (lossless)
hsd_reference_cases = _hsd_cases(False)  # hsd_ref: the paper's reference form


def mtad_cases(P: torch.Tensor, Q: torch.Tensor, x: torch.Tensor, tau: float = 1.0, **params):
    """MTAD's threshold on the draft's joint probability (no coins)."""
    log_q = torch.log(Q[torch.arange(x.shape[0]), x])
    n, dist = mtad_verify(P, log_q, x, tau)
    yield 1.0, int(n), dist


def chain_cases(rule: str, P: torch.Tensor, Q: torch.Tensor, x: torch.Tensor, tau: float):
    """(probability, accepted n, next-token distribution) of one verification of draft ``x`` by method ``rule``'s
    chain rule (its declared ``ChainRule.exact``)."""
    if rule not in chain_rules():
        raise ValueError(f"unknown chain rule {rule!r}; chain rules: {', '.join(chain_rules())}")
    declared = METHODS[rule].rule
    yield from declared.exact(P, Q, x, **({"tau": tau} if "tau" in declared.params else {}))


def _chain_paths(rule: str, pair: Pair, gamma: int, tau: float):
    for x in itertools.product(range(pair.vocab), repeat=gamma):
        qx = 1.0
        for i, t in enumerate(x):
            qx *= float(pair.draft(x[:i])[t])
        if qx == 0:
            continue
        P = torch.stack([pair.target(x[:i]) for i in range(gamma + 1)])
        Q = torch.stack([pair.draft(x[:i]) for i in range(gamma)])
        for pr, n, dist in chain_cases(rule, P, Q, torch.tensor(x), tau):
            yield qx * pr, x[:n], dist


# ---------------------------------------------------------------------------------------------------
# Tree rules: every tree drawn as the methods draw it, every outcome of the walk
# ---------------------------------------------------------------------------------------------------


def _draws(q: torch.Tensor, k: int, replacement: bool) -> list[tuple[Prefix, float]]:
    """Every ordered list of children drawn from q (``warping.sample_k``): k i.i.d. draws, or the first
    ``min(k, support)`` draws without replacement."""
    support = [v for v in range(q.shape[0]) if q[v] > 0]
    if replacement:
        out = []
        for kids in itertools.product(support, repeat=k):
            pr = 1.0
            for v in kids:
                pr *= float(q[v])
            out.append((kids, pr))
        return out
    out = []
    for kids in itertools.permutations(support, min(k, len(support))):
        pr, left = 1.0, 1.0
        for v in kids:
            pr *= float(q[v]) / left
            left -= float(q[v])
        out.append((kids, pr))
    return out


def draft_trees(pair: Pair, k_config: list[int], replacement: bool) -> list[tuple[TokenTree, torch.Tensor, float]]:
    """Every draft tree with ``k_config[d]`` children under each depth-(d-1) node (``sample_token_tree``'s
    shapes and order), its target rows ``P [1 + n, V]`` and its probability."""
    states: list[tuple[tuple[tuple[int, int], ...], float, list[int]]] = [((), 1.0, [-1])]
    for k in k_config:
        nxt = []
        for nodes, pr, frontier in states:
            combos: list[tuple[tuple[tuple[int, int], ...], float, list[int]]] = [(nodes, pr, [])]
            for parent in frontier:
                q = pair.draft(_path_tokens(nodes, parent))
                combos = [
                    (nd + tuple((t, parent) for t in kids), p0 * pk, fr + list(range(len(nd), len(nd) + len(kids))))
                    for nd, p0, fr in combos
                    for kids, pk in _draws(q, k, replacement)
                ]
            nxt.extend(combos)
        states = nxt
    out = []
    for nodes, pr, _ in states:
        tree = TokenTree(0)
        for t, parent in nodes:
            tree.add(t, parent)
        for parent in sorted({parent for _, parent in nodes}):
            tree.q_rows[parent + 1] = pair.draft(_path_tokens(nodes, parent))
        P = torch.stack([pair.target(())] + [pair.target(_path_tokens(nodes, i)) for i in range(len(nodes))])
        out.append((tree, P, pr))
    return out


def _path_tokens(nodes, node: int) -> Prefix:
    out = []
    while node >= 0:
        out.append(nodes[node][0])
        node = nodes[node][1]
    return tuple(out[::-1])


def _mss_walk(P, tree: TokenTree, replacement: bool, node: int = -1):
    """SpecInfer / MCSS (``tree_verify.mss_tree_walk``): (probability, path, distribution) of every outcome."""
    kids = tree.children[node + 1]
    if not kids:
        return [(1.0, [], P[node + 1])]
    cands = torch.tensor([tree.tokens[c] for c in kids])
    a, residual = multi_candidate_acceptance(P[node + 1], tree.q_rows[node + 1], cands, replacement)
    out, reach = [], 1.0
    for j, child in enumerate(kids):
        pj = reach * float(a[j])
        if pj > 0:
            out += [(pj * pr, [child, *path], dist) for pr, path, dist in _mss_walk(P, tree, replacement, child)]
        reach *= 1.0 - float(a[j])
    if reach > 0:
        out.append((reach, [], residual))
    return out


def _kseq_walk(P, tree: TokenTree, parent: int = -1, alive: list[int] | None = None, last: int = -1):
    """SpecTr over k i.i.d. chains (``tree_verify.kseq_chain_walk``)."""
    alive = list(tree.children[0]) if alive is None else alive
    prefix = tree.path(last) if last >= 0 else []
    if not alive:
        return [(1.0, prefix, P[last + 1])]
    cands = torch.tensor([tree.tokens[c] for c in alive])
    a, residual = kseq_acceptance(P[parent + 1], tree.q_rows[parent + 1], cands)
    out, reach = [], 1.0
    for j, chain in enumerate(alive):
        pj = reach * float(a[j])
        if pj > 0:
            survivors = [c for c in alive if tree.tokens[c] == tree.tokens[chain]]
            nxt = [k for c in survivors for k in tree.children[c + 1]]
            out += [(pj * pr, path, dist) for pr, path, dist in _kseq_walk(P, tree, survivors[0], nxt, survivors[0])]
        reach *= 1.0 - float(a[j])
    if reach > 0:
        out.append((reach, prefix, residual))
    return out


def _tree_paths(rule: str, pair: Pair, k_config: list[int]):
    replacement = METHODS[rule].walk.children == "iid"
    for tree, P, pr in draft_trees(pair, k_config, replacement):
        for w, path, dist in walk_cases(rule, P, tree):
            yield pr * w, tuple(tree.tokens[i] for i in path), dist


def mss_iid_cases(P: torch.Tensor, tree: TokenTree):
    """SpecInfer: multi-step speculative sampling over i.i.d. children."""
    return _mss_walk(P, tree, True)


def mss_distinct_cases(P: torch.Tensor, tree: TokenTree):
    """MCSS: multi-step speculative sampling over children drawn without replacement."""
    return _mss_walk(P, tree, False)


def kseq_cases(P: torch.Tensor, tree: TokenTree):
    """SpecTr's K-SEQ over k i.i.d. chains."""
    return _kseq_walk(P, tree)


def traversal_cases(P: torch.Tensor, tree: TokenTree):
    """Traversal verification, re-run once per sequence of coin outcomes."""
    return [(w, *res) for w, res in coin_cases(lambda coin: traversal_walk(P, tree, coin))]


def walk_cases(rule: str, P: torch.Tensor, tree: TokenTree) -> list[tuple[float, list[int], torch.Tensor]]:
    """(probability, accepted path, next-token distribution) of every outcome of method ``rule``'s tree walk on
    ``tree`` (its declared ``TreeWalk.exact``)."""
    if rule not in tree_rules():
        raise ValueError(f"unknown tree rule {rule!r}; tree rules: {', '.join(tree_rules())}")
    return METHODS[rule].walk.exact(P, tree)


# ---------------------------------------------------------------------------------------------------
# Evaluation
# ---------------------------------------------------------------------------------------------------


def evaluate(
    rule: str, pair: Pair, gamma: int | None = None, k_config: list[int] | None = None, tau: float = 1.0
) -> Outcome:
    """The exact outcome of one iteration of ``rule``: chain rules draft ``gamma`` tokens (MTAD with threshold
    ``tau`` verifies a chain drawn from q, as with a chain drafter); tree rules draft ``k_config`` (SpecTr:
    ``[k, 1, ..., 1]``, k i.i.d. chains)."""
    if rule in chain_rules():
        if not gamma or gamma < 1:
            raise ValueError(f"rule {rule!r} drafts a chain: give gamma >= 1")
        paths, depth, bound = _chain_paths(rule, pair, gamma, tau), gamma, prefix_bound(pair, gamma)
    elif rule in tree_rules():
        if not k_config or min(k_config) < 1:
            raise ValueError(f"rule {rule!r} drafts a tree: give k_config, children per depth (each >= 1)")
        if METHODS[rule].walk.chains and any(k != 1 for k in k_config[1:]):
            raise ValueError(f"{rule} drafts k i.i.d. chains: k_config must be [k, 1, ..., 1], got {k_config}")
        paths, depth, bound = _tree_paths(rule, pair, list(k_config)), len(k_config), None
    else:
        raise ValueError(f"unknown rule {rule!r}; rules: {', '.join(chain_rules() + tree_rules())}")
    out = Outcome(rule, depth + 1, bound=bound)
    for pr, tokens, dist in paths:
        out.accepted_law[len(tokens)] = out.accepted_law.get(len(tokens), 0.0) + pr
        for y in range(pair.vocab):
            if dist[y] > 0:
                seq = (*tokens, y)
                out.emitted[seq] = out.emitted.get(seq, 0.0) + pr * float(dist[y] / dist.sum())
    for seq, pr in out.emitted.items():
        for rest, pc in _continuations(pair, seq, out.horizon - len(seq)).items():
            out.law[seq + rest] = out.law.get(seq + rest, 0.0) + pr * pc
    out.distance = total_variation(out.law, sequence_law(pair, out.horizon))
    return out


def _continuations(pair: Pair, prefix: Prefix, length: int) -> Law:
    law: Law = {(): 1.0}
    for _ in range(length):
        law = {
            s + (v,): pr * float(r[v])
            for s, pr in law.items()
            for r in [pair.target(prefix + s)]
            for v in range(pair.vocab)
            if r[v] > 0
        }
    return law


def table(pair: Pair, gamma: int, k_config: list[int], num_drafts: int, tau: float = 1.0) -> list[Outcome]:
    """Every rule on ``pair``: the chain rules at ``gamma``, the tree walks on ``k_config``, a walk over chains
    (SpecTr) on ``num_drafts`` chains of ``gamma`` tokens."""
    rows = [evaluate(r, pair, gamma=gamma, tau=tau) for r in chain_rules()]
    rows += [evaluate(r, pair, k_config=tree_config(r, k_config, num_drafts, gamma)) for r in tree_rules()]
    return rows


def tree_config(rule: str, k_config: list[int], num_drafts: int, gamma: int) -> list[int]:
    """The tree method ``rule`` drafts: ``k_config``, or ``num_drafts`` chains of ``gamma`` for a walk over chains."""
    return [num_drafts] + [1] * (gamma - 1) if METHODS[rule].walk.chains else list(k_config)
