"""Token trees for spectr, specinfer, mcss and medusa: how they are drafted, scored and walked.

The loop that uses them is ``speculative.TreeVerifyDecoder``. A draft tree (``tree.TokenTree``)
holds nodes in BFS order, each with a token and a parent (-1 = the last context token, the root):
``sample_token_tree`` draws one from the draft model level by level (``draft_trees``: several requests' trees,
one packed draft forward per level), ``cartesian_tree`` builds
Medusa's from its heads' top-k. ``tree_verify_forward`` scores every node in ONE target pass
with tree attention (4-D mask + position ids, docs/ALGORITHMS.md A.2): row 0 is the root's row (the
distribution of depth-0 nodes), row 1 + i is node i's row. The walks (A.3) return the accepted
path (node indices, root to leaf) and what the next token is drawn from; ``CachedModel.compact``
then moves the path's KV into place (``keep_path`` of the loop's cache, ``packed.py``: ``CachedModel.compact`` at
batch 1), an O(path) copy. The loop (``batched.py``) runs the target pass itself, several requests' trees in one
packed forward at batch > 1; ``tree_verify_forward`` is that pass over one request's tree in the model's own cache
(the cost probe's, ``measure/costs.py``).

Layout in the target cache during verification (context of length L, cache holding ``ctx[:L-1]``):
slot L-1 = the root ``ctx[-1]``, slot L + i = node i. In the draft cache (holding the whole context
after the first draft forward): slot L + i = node i for the nodes that were fed (all but the last
level); ``ModelDrafter.feedback`` keeps the accepted ones (``keep_path``).
"""

from __future__ import annotations

import torch

from .drafting import TreeAsk
from .kv import CachedModel
from .packed import Lanes, PackedRows, SoloCache
from .tree import TokenTree
from .verification import kseq_verify, multi_candidate_verify, one_hot_acceptance, typical_acceptance
from .warping import Warper, sample_k


def _draw_children(
    q: torch.Tensor, logits: torch.Tensor, k: int, replacement: bool, greedy: bool, generator
) -> list[int]:
    """k children of one node: i.i.d. (``replacement``) or sequentially without replacement from q.

    Without replacement, a warped support smaller than k gives fewer children. Temperature 0: the
    k most likely distinct tokens of the draft logits (q is one-hot; distinct children only help).
    """
    if greedy:
        finite = int(torch.isfinite(logits).sum())
        return logits.topk(min(k, finite)).indices.tolist()
    return sample_k(q, k, replacement, generator).tolist()


def _ranked(logits: torch.Tensor, q: torch.Tensor, warped: bool) -> torch.Tensor:
    """What top-k children are ranked by: the raw logits (temperature 0), or the warped row (``warped``: ``top``
    children at a temperature, inside the warped support only)."""
    return torch.log(q) if warped else logits


def sample_token_tree(
    draft: CachedModel,
    context: list[int],
    k_config: list[int],
    warper: Warper,
    generator: torch.Generator | None,
    children: str = "iid",
) -> TokenTree:
    """Sample a tree from the draft: ``k_config[d]`` children under every depth-(d-1) node, each level
    drawn from the draft's row at its parent (one draft forward per level, the level's nodes fed as
    a tree): ``iid`` (with replacement), ``distinct`` (without) or the ``top`` k tokens of the warped row.
    ``k_config = [k, 1, ..., 1]`` with ``iid`` gives k i.i.d. chains (SpecTr). ``draft_trees`` of one request in
    the model's own cache."""
    return draft_trees(draft, SoloCache(draft), [TreeAsk(0, context, list(k_config), generator)], warper, children)[0]


def draft_trees(
    model: CachedModel, cache: Lanes, asks: list[TreeAsk], warper: Warper, children: str = "iid"
) -> list[TokenTree]:
    """Each ask's tree from the draft ``model`` (``sample_token_tree``'s), every request's level in one forward:
    forward 0 feeds each request's context past what its sequence in ``cache`` holds (its prompt, in a packed
    cache's first step) and its last row gives the roots; forward d feeds each request's depth-(d-1) nodes as a
    tree (each row sees its context, its ancestors and itself) and their rows give their children. A request's
    children are drawn with its own generator in the order it draws them alone, from rows that on the bf16 kernels
    are bit-identical to its rows alone. Afterwards each sequence holds its context and every node but the last
    level's (``TokenTree.fed``); the draft forwards a request took part in are added to ``ask.drafter.drafted``
    (when the ask names a drafter)."""
    replacement = children == "iid"
    top = warper.greedy or children == "top"
    warped = children == "top" and not warper.greedy
    trees = [TokenTree(len(a.context)) for a in asks]
    parents: list[list[int]] = [[-1] for _ in asks]  # the nodes whose children the next forward's rows give
    going = [i for i, a in enumerate(asks) if a.shape]
    depth = 0
    while going:
        groups = []
        for i in going:
            a, tree = asks[i], trees[i]
            if depth == 0:
                feed = torch.tensor(a.context[cache.length(a.slot) :], dtype=torch.long)
                groups.append(PackedRows(a.slot, feed, [feed.numel() - 1]))
            else:
                old = tree.fed
                ids, positions, anc = tree.feed()  # the nodes not yet fed: the last level
                m = ids.numel()
                sees = torch.cat([torch.ones(m, tree.start, dtype=torch.bool), anc[:, :old]], 1)
                groups.append(PackedRows(a.slot, ids, list(range(m)), positions, sees, anc[:, old:]))
        raws = cache.step(groups)
        nxt = []
        for i, raw in zip(going, raws):
            a, tree = asks[i], trees[i]
            if a.drafter is not None:
                a.drafter.drafted += 1
            rows = model.logits(raw)
            qs = warper(rows)
            level = []
            for node, row_logits, q in zip(parents[i], rows, qs):
                tree.q_rows[node + 1] = q
                for t in _draw_children(
                    q, _ranked(row_logits, q, warped), a.shape[depth], replacement, top, a.generator
                ):
                    level.append(tree.add(t, node))
            parents[i] = level
            if level and depth + 1 < len(a.shape):
                nxt.append(i)
        going, depth = nxt, depth + 1
    return trees


def cartesian_tree(head_logits: torch.Tensor, k_config: list[int], start: int) -> TokenTree:
    """Medusa's tree after a context of ``start`` tokens: depth d holds the ``k_config[d]`` most likely
    tokens of ``head_logits[d]`` under every depth-(d-1) node, in rank order (the heads see only the
    root, so sibling sets repeat)."""
    tree = TokenTree(start)
    level = [-1]
    for d, k in enumerate(k_config[: head_logits.shape[0]]):
        top = head_logits[d].topk(min(k, head_logits.shape[-1])).indices.tolist()
        level = [tree.add(t, parent) for parent in level for t in top]
    return tree


def tree_verify_forward(target: CachedModel, context: list[int], tree: TokenTree) -> torch.Tensor:
    """One target pass over ``[ctx[-1]] + nodes`` with tree attention; logits ``[1 + n, V]``.

    The target's cache must hold ``ctx[:-1]``; afterwards it also holds the root and every node.
    """
    start = len(context) - 1
    if target.length != start or tree.start != len(context):
        raise RuntimeError(
            f"target cache holds {target.length} positions and the tree starts at {tree.start}; "
            f"expected {start} and {len(context)}"
        )
    ids, positions, mask = tree.with_root(context[-1])
    return target.forward_tree(ids, positions, mask, start)


# ------------------------------------------------------------------------------------------------
# Walks. P [1 + n, V]: warped target rows (row 0: root). Each returns (path, next-token distribution).
# ------------------------------------------------------------------------------------------------


def greedy_tree_walk(target_argmax: torch.Tensor, tree: TokenTree) -> tuple[list[int], int]:
    """Temperature 0: follow the child equal to the target's argmax; the next token is the argmax at the end."""
    am = target_argmax.tolist()
    path: list[int] = []
    node = -1
    while True:
        want = am[node + 1]
        nxt = next((c for c in tree.children[node + 1] if tree.tokens[c] == want), None)
        if nxt is None:
            return path, want
        path.append(nxt)
        node = nxt


def mss_tree_walk(
    P: torch.Tensor, tree: TokenTree, generator, replacement: bool = True
) -> tuple[list[int], torch.Tensor]:
    """SpecInfer (``replacement``) / MCSS (without): multi-candidate rule at each node from the root."""
    path: list[int] = []
    node = -1
    while True:
        kids = tree.children[node + 1]
        p = P[node + 1]
        if not kids:
            return path, p  # a leaf: its plain row is the bonus row
        cands = torch.tensor([tree.tokens[c] for c in kids], device=P.device)
        u = torch.rand(len(kids), generator=generator, device=P.device)
        hit, residual = multi_candidate_verify(p, tree.q_rows[node + 1], cands, u, replacement)
        j = int(hit)
        if j == len(kids):
            return path, residual
        node = kids[j]
        path.append(node)


def kseq_chain_walk(P: torch.Tensor, tree: TokenTree, generator) -> tuple[list[int], torch.Tensor]:
    """SpecTr over k i.i.d. chains (a tree with ``k_config = [k, 1, 1, ...]``): K-SEQ at each depth on the
    chains that agree with the accepted prefix; every chain carrying the accepted token stays alive."""
    alive = list(tree.children[0])
    parent = -1  # any node on the accepted prefix (all alive chains share its tokens)
    last = -1
    while alive:
        p, q = P[parent + 1], tree.q_rows[parent + 1]
        cands = torch.tensor([tree.tokens[c] for c in alive], device=P.device)
        u = torch.rand(len(alive), generator=generator, device=P.device)
        hit, residual = kseq_verify(p, q, cands, u)
        j = int(hit)
        if j == len(alive):
            return tree.path(last) if last >= 0 else [], residual
        token = tree.tokens[alive[j]]
        survivors = [c for c in alive if tree.tokens[c] == token]
        last = parent = survivors[0]
        alive = [k for c in survivors for k in tree.children[c + 1]]
    return tree.path(last), P[last + 1]


def one_hot_tree_walk(
    P: torch.Tensor, tree: TokenTree, generator, greedy: bool = False
) -> tuple[list[int], torch.Tensor]:
    """Deterministic children (Medusa's top-k, EAGLE-style): the one-hot recursive rule at each node.

    Lossless. With one-hot rows (``greedy``) it follows the argmax child and draws no random number.
    """
    path: list[int] = []
    node = -1
    while True:
        kids = tree.children[node + 1]
        p = P[node + 1]
        if not kids:
            return path, p
        cands = torch.tensor([tree.tokens[c] for c in kids], device=P.device)
        a, residual = one_hot_acceptance(p, cands)
        if greedy:
            u = torch.full((len(kids),), 0.5, device=P.device)
        else:
            u = torch.rand(len(kids), generator=generator, device=P.device)
        flags = (u < a).tolist()
        j = flags.index(True) if True in flags else len(kids)
        if j == len(kids):
            return path, residual
        node = kids[j]
        path.append(node)


def typical_tree_rule(
    P: torch.Tensor, tree: TokenTree, generator, *, epsilon: float, delta: float, recovery: str = "sample"
) -> tuple[list[int], torch.Tensor]:
    """Typical acceptance over any tree as a walk: the longest typical path (``typical_tree_walk``) and the
    target row after it, or its argmax token with ``recovery: argmax`` (Medusa's "fast" mode)."""
    path, row = typical_tree_walk(P, tree, epsilon, delta)
    return path, P[row].argmax(-1) if recovery == "argmax" else P[row]


def mss_rule(
    P: torch.Tensor, tree: TokenTree, generator, *, replacement: bool = True
) -> tuple[list[int], torch.Tensor]:
    """``mss_tree_walk`` as a walk of the tree loop (SpecInfer with replacement, MCSS without)."""
    return mss_tree_walk(P, tree, generator, replacement)


def typical_tree_walk(P: torch.Tensor, tree: TokenTree, epsilon: float, delta: float) -> tuple[list[int], int]:
    """Typical acceptance over a tree (Medusa-2): every node passes or not under its parent's row; the
    longest passing root-to-node path wins, ties broken by the sum of log-probabilities. Returns
    (path, row index whose distribution gives the next token)."""
    n = len(tree)
    if n == 0:
        return [], 0
    tokens = torch.tensor(tree.tokens, device=P.device)
    parent_rows = torch.tensor([p + 1 for p in tree.parents], device=P.device)
    rows = P[parent_rows]  # [n, V]
    ok = typical_acceptance(rows, tokens, epsilon, delta).tolist()
    logp = torch.log(rows.gather(-1, tokens[:, None]).squeeze(-1).clamp_min(1e-30)).tolist()
    best: tuple[int, float, int] = (0, 0.0, -1)  # (length, log-likelihood, node)
    score: list[tuple[int, float] | None] = [None] * n
    for i in range(n):  # BFS: parents come first
        par = tree.parents[i]
        above = (0, 0.0) if par < 0 else score[par]
        if not ok[i] or above is None:
            continue
        length, ll = above
        here = (length + 1, ll + logp[i])
        score[i] = here
        if here > (best[0], best[1]):
            best = (here[0], here[1], i)
    if best[2] < 0:
        return [], 0
    return tree.path(best[2]), best[2] + 1
