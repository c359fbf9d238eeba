"""The EAGLE drafters (``drafters.py``'s plugin interface over ``eagle.py`` / ``eagle3.py``'s heads): chains and
EAGLE-2 dynamic trees by feature-level autoregression on the target's hidden states."""

from __future__ import annotations

import torch

from .base import Param, int_at_least
from .drafter_context import eagle_version
from .drafter_scope import optional_path
from .drafters import TREE_CHILDREN, Drafter
from .drafting import ChainDraft
from .eagle import EagleHead, EagleRunner, load_eagle, place_eagle_head
from .eagle3 import Eagle3Head
from .tree import TokenTree
from .tree_verify import _draw_children
from .warping import Warper, sample


class EagleDrafter(Drafter):
    """EAGLE-1/2 chain drafting: feature-level autoregression on the target's last hidden states.

    Head position p consumes (f_p, x_{p+1}) and predicts f_{p+1}, whose LM-head row drafts x_{p+2}.
    With a context of L tokens the target has given features f_0 .. f_{L-2}; the head catches up on
    the positions it has not seen with real features (one forward), then drafts autoregressively on
    its own predicted features. Positions drafted on predicted features are recomputed with the
    target's real ones at the next ``propose``. (EAGLE-3, ``Eagle3Drafter``, runs the same loop on the
    inputs of three target layers.)
    """

    kind = "eagle"
    version = 1
    shapes = frozenset({"chain", "tree"})
    tree_children = frozenset(TREE_CHILDREN)
    asset = "eagle"
    asset_help = (
        "a folder with an EAGLE-1/2 or EAGLE-3 head for the target (pipeline.train_eagle, or a published checkpoint)"
    )
    uses_hidden = True
    batchable = True  # one copy per batch slot (``fork``: its own head cache and features)
    params = {
        "path": Param(None, optional_path, "an EAGLE head folder (null: the pair's `eagle:`)"),
        "top_nodes": Param(
            4,
            int_at_least(0),
            "trees (specinfer, mcss): nodes expanded per level, by cumulative draft probability (0 = all)",
        ),
        "max_nodes": Param(
            0, int_at_least(0), "trees (specinfer, mcss): node budget (0 = the method's k_config decides)"
        ),
    }

    def __init__(self, runner, top_nodes: int = 4, max_nodes: int = 0) -> None:
        self.runner = runner
        self.real = 0  # head cache positions computed from real target features
        self.top_nodes, self.max_nodes = top_nodes, max_nodes

    @classmethod
    def check(cls, method, scope, ctx) -> None:
        if scope.get("path"):
            version = eagle_version(scope["path"])
            if version is None:
                raise ValueError(
                    f"method {method!r}: drafter {cls.kind} path {scope['path']!r} has no config.json: "
                    "point it at an EAGLE head folder"
                )
        elif not ctx.has_eagle:
            raise ValueError(
                f"method {method!r} with drafter: {cls.kind} needs an EAGLE head: add `eagle: models/<dir>` to the "
                f"pair config (or pair.eagle=<folder>, or drafter: {{kind: {cls.kind}, path: <folder>}}; "
                "train one with `python -m pipeline.train_eagle pair=<pair>`), or choose drafter: model | ngram"
            )
        else:
            version = ctx.eagle_version
        if version is not None and (version == 3) != (cls.version == 3):
            have = "an EAGLE-3" if version == 3 else "an EAGLE-1/2"
            raise ValueError(
                f"method {method!r}: drafter {cls.kind} but the head folder holds {have} head: "
                f"use drafter: {'eagle3' if version == 3 else 'eagle'}"
            )

    @classmethod
    def create(cls, decoder, scope):
        target = decoder.target.model
        head: EagleHead | Eagle3Head | None
        if scope.get("path"):
            head = load_eagle(scope["path"], target)
        else:
            head = decoder.assets.get("eagle") or getattr(target, "eagle_head", None)
            if head is None:
                raise ValueError(
                    f"method {decoder.name!r} with drafter: {cls.kind} needs an EAGLE head: "
                    "pass assets={'eagle': head} (pipeline.decoding.eagle.load_eagle(path, target)), "
                    "or add `eagle: models/<dir>` to the pair config"
                )
            place_eagle_head(target, head)
        if isinstance(head, Eagle3Head) != (cls.version == 3):
            raise ValueError(
                f"method {decoder.name!r}: drafter {cls.kind} was given an "
                f"EAGLE-{'3' if isinstance(head, Eagle3Head) else '1/2'} head"
            )
        if isinstance(head, Eagle3Head):
            decoder.target.capture_layers = head.layers_of(target.config.num_hidden_layers)
        return cls(
            EagleRunner(target, head, decoder.target.vocab_size), scope.get("top_nodes", 4), scope.get("max_nodes", 0)
        )

    def fork(self) -> "EagleDrafter":
        return type(self)(self.runner.fork(), self.top_nodes, self.max_nodes)

    def start(self, prompt, hidden=None) -> None:
        if hidden is None:
            raise ValueError("the EAGLE drafter needs the target's hidden states of the prompt")
        self.runner.reset()
        self.real = 0
        self.runner.observe(hidden, 0)

    def rollback(self, length: int) -> None:
        """Nothing to cut: the head's cache is re-synchronised with the target's real features (``observe``)."""

    def observe(self, hidden, start) -> None:
        self.runner.observe(hidden, start)
        self.real = min(self.real, start)

    def _catch_up(self, context) -> torch.Tensor | None:
        """Run the head over the positions it has not seen with the target's real features; the predicted
        feature after the context ``[1, h]`` (None: no feature yet, a one-token prompt)."""
        r = self.runner
        n_feat = r.features.shape[0]  # == len(context) - 1
        if n_feat == 0:
            return None
        real = min(self.real, n_feat - 1)
        r.rollback(real)
        ids = torch.tensor(context[real + 1 : n_feat + 1], dtype=torch.long, device=r.device)
        feature = r.step(r.features[real:n_feat], ids, real)[-1:]
        self.real = n_feat
        return feature

    def propose_tree(
        self, context, k_config: list[int], warper: Warper, generator, children: str = "iid"
    ) -> TokenTree | None:
        """An EAGLE-2 dynamic tree after ``context`` (for specinfer / mcss): level d gives ``k_config[d]``
        children to each of the ``top_nodes`` nodes of level d - 1 with the highest cumulative draft
        probability (the root's children: ``k_config[0]``), within a budget of ``max_nodes`` nodes given in
        that order. Children are drawn from the node's warped draft row q (``iid``, or ``distinct``: without
        replacement; the multi-candidate walks' contract), so verification stays exact; EAGLE-2's after-the-fact
        rerank to the budget would bias which candidates a node keeps, so the budget is spent while expanding.
        Temperature 0 or ``top`` (EAGLE-2's own drafting, e.g. for typical acceptance): the top-k distinct
        tokens of the warped row. Node i of the tree is head cache slot ``n_feat + i``."""
        replacement, deterministic = children == "iid", children == "top"
        root = self._catch_up(context)
        if root is None:
            return None
        r = self.runner
        n_feat = r.features.shape[0]
        tree = TokenTree(len(context))  # the target's view: nodes follow the whole context
        budget = self.max_nodes or None
        value: dict[int, float] = {}
        predicted = {-1: root[-1]}

        def expand(node: int, k: int) -> list[int]:
            logits = r.logits(predicted[node])
            q = warper(logits)
            tree.q_rows[node + 1] = q
            rank = logits.softmax(-1) if warper.greedy else q
            if budget is not None:
                k = min(k, budget - len(tree))
            if k <= 0:
                return []
            out = []
            top = warper.greedy or deterministic
            for t in _draw_children(q, logits if not deterministic else torch.log(q), k, replacement, top, generator):
                child = tree.add(t, node)
                value[child] = value.get(node, 1.0) * float(rank[t])
                out.append(child)
            return out

        level = expand(-1, k_config[0])
        for k in k_config[1:]:
            if not level or (budget is not None and len(tree) >= budget):
                break
            ids, positions, anc = tree.feed()  # this level's nodes, after the fed ones
            fed = list(range(tree.fed - len(ids), tree.fed))
            mask = torch.ones(len(ids), n_feat + tree.fed, dtype=torch.bool)
            mask[:, n_feat:] = anc
            feats = torch.stack([predicted[tree.parents[i]] for i in fed])
            out = r.step_tree(feats, ids, positions - 1, mask)  # head row of a depth-d node: position n_feat + d
            predicted.update(zip(fed, out))
            ranked = sorted(level, key=lambda n: -value[n])
            chosen = ranked[: self.top_nodes] if self.top_nodes else ranked
            level = [c for node in chosen for c in expand(node, k)]
        return tree

    def propose(self, context, gamma, warper, generator):
        r = self.runner
        feature = self._catch_up(context)
        if feature is None:  # a one-token prompt: no feature yet, the first step is the target's own
            return None
        n_feat = r.features.shape[0]
        tokens, rows = [], []
        pos = n_feat
        for i in range(gamma):
            q = warper(r.logits(feature[-1]))
            t = q.argmax(-1) if warper.greedy else sample(q, generator)
            tokens.append(t)
            rows.append(q)
            if i + 1 < gamma:
                feature = r.step(feature, t.reshape(1), pos)
                pos += 1
        return ChainDraft(torch.stack(tokens), torch.stack(rows))

    @property
    def forwards(self) -> int:
        return self.runner.forwards


class Eagle3Drafter(EagleDrafter):
    """EAGLE-3 chain drafting (``pipeline.decoding.eagle3``): the loop of ``EagleDrafter`` on the inputs of
    three target decoder layers (``fc`` maps them to the head's width; predicted features are fed back
    as they are), draft rows over the head's draft vocabulary placed on the target's (q = 0 elsewhere)."""

    kind = "eagle3"
    version = 3
