"""beam: beam search (``sample: false``) and beam sampling (``sample: true``) with the target.

HF semantics (docs/ALGORITHMS.md 1.2, 1.3): W beams scored by the running sum of log-probabilities;
each step takes 2W candidates (top-2W, or 2W drawn without replacement from
softmax(score + warped log-prob) when sampling), keeps W that do not end in EOS, and files those
ending in EOS as finished hypotheses scored ``sum_logprobs / length ** length_penalty``. The search
stops when W hypotheses are finished and no live beam can beat them, or at ``max_new_tokens``.
The beams share the prompt KV through a token tree; ``steps`` counts target forwards and
``accepted`` is one token per step of the returned hypothesis.
"""

from __future__ import annotations

import torch

from .base import Decoder, Generation, Param, boolean, int_at_least, nonneg_number
from .tree import TokenTree
from .warping import sample_k


class BeamSearchDecoder(Decoder):
    name = "beam"
    params = {
        "num_beams": Param(4, int_at_least(1), "beam width W"),
        "sample": Param(False, boolean, "beam sampling instead of deterministic beam search"),
        "length_penalty": Param(1.0, nonneg_number, "exponent of the length normalization"),
    }

    def _step_scores(self, logits: torch.Tensor) -> torch.Tensor:
        if self.args.sample and not self.warper.greedy:
            return torch.log(self.warper(logits))
        return torch.log_softmax(logits, -1)

    def _generate(self, prompt, max_new_tokens, eos, generator) -> Generation:
        target, width = self.target, self.args.num_beams
        self._start(prompt)
        logp = self._step_scores(target.forward(prompt[-1:], keep=1))  # [1, V]
        start = target.length
        tree = TokenTree(start)
        scores = torch.zeros(1, device=logp.device)
        seqs: list[list[int]] = [[]]
        nodes: list[int] = [-1]  # tree node of each live beam's last fed token
        finished: list[tuple[float, list[int]]] = []
        vocab = logp.shape[-1]
        for step in range(1, max_new_tokens + 1):
            cand = (scores[:, None] + logp).flatten()
            k = min(2 * width, int(torch.isfinite(cand).sum()))
            if self.args.sample and not self.warper.greedy:
                probs = torch.softmax(cand, 0)
                pick = sample_k(probs, k, False, generator)
                pick = pick[cand[pick].argsort(descending=True)]
            else:
                pick = cand.topk(k).indices
            new_scores: list[torch.Tensor] = []
            new_seqs: list[list[int]] = []
            new_parents: list[int] = []
            new_tokens: list[int] = []
            for idx in pick.tolist():
                b, tok = divmod(idx, vocab)
                seq = seqs[b] + [tok]
                if tok in eos or step == max_new_tokens:
                    finished.append((float(cand[idx]) / (len(seq) ** self.args.length_penalty), seq))
                    continue
                if len(new_seqs) < width:
                    new_scores.append(cand[idx])
                    new_seqs.append(seq)
                    new_parents.append(nodes[b])
                    new_tokens.append(tok)
            if not new_seqs or self._done(finished, new_scores, step):
                break
            nodes = tree.extend(new_tokens, new_parents)
            ids, positions, mask = tree.feed()
            logp = self._step_scores(target.forward_tree(ids, positions, mask, start))
            scores = torch.stack(new_scores)
            seqs = new_seqs
        best = max(finished, key=lambda f: f[0])[1] if finished else seqs[0]
        return Generation(best, target.forwards, 0, [1] * len(best))

    def _done(self, finished, live_scores, step: int) -> bool:
        """HF's ``early_stopping=False`` rule: W finished and the best live beam cannot beat the worst."""
        if len(finished) < self.args.num_beams:
            return False
        worst_kept = sorted(f[0] for f in finished)[-self.args.num_beams]
        best_live = float(max(live_scores)) / (step**self.args.length_penalty)
        return worst_kept >= best_live
