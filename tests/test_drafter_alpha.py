"""Held-out first-token alpha of the heads beside the draft (pipeline.training.drafter_alpha), on tiny models:
each head's row at an answer position is the one it would draft from the true prefix alone."""

from __future__ import annotations

import pytest
import torch

from helpers.heads import eagle3_head_folder, eagle_head_folder, medusa_heads_folder
from helpers.models import tiny_llama
from pipeline.decoding.eagle import load_eagle_head
from pipeline.decoding.eagle3 import load_eagle3_head
from pipeline.decoding.medusa_heads import load_medusa_heads
from pipeline.decoding.warping import Warper
from pipeline.training.drafter_alpha import head_alphas


def heldout(target, n: int = 3) -> dict:
    g = torch.Generator().manual_seed(0)
    rows = []
    with torch.no_grad():
        for _ in range(n):
            ids = torch.randint(3, 48, (12,), generator=g)
            start = 5
            logits = target(ids[None]).logits[0, start - 1 : len(ids) - 1]
            p = Warper(1.0, 10, 0.9)(logits)
            vals, idx = p.topk(10, dim=-1)
            rows.append({"ids": ids, "start": start, "p_ids": idx, "p": vals, "argmax": logits.argmax(-1)})
    return {"rows": rows}


@torch.no_grad()
def reference(target, held, head, kind: str) -> float:
    """The same figure one answer position at a time, each head run on the prefix it would see when drafting."""
    warper, embed, lm = Warper(1.0, 10, 0.9), target.get_input_embeddings(), target.get_output_embeddings().weight
    total, n = 0.0, 0
    for row in held["rows"]:
        ids, start = row["ids"], row["start"]
        for j, k in enumerate(range(start, len(ids))):  # the answer token k, drafted after the prefix ids[:k]
            out = target.get_decoder()(input_ids=ids[None, :k], output_hidden_states=True)
            last = out.last_hidden_state[0]
            if kind == "medusa":  # head 1 on h_{k-2} proposes x_k (x_{k-1} is the target's own token)
                z = head(last[k - 2], target.get_output_embeddings())[0]
            elif kind == "eagle":  # f_{t} with emb(x_{t+1}) for t < k - 1, causally: the last row predicts f_{k-1}
                pred = head(last[None, : k - 1], embed(ids[None, 1:k]), torch.arange(k - 1)[None])[0, -1]
                z = torch.full((lm.shape[0],), float("-inf"))
                z[head.token_map] = pred @ lm[head.token_map].T
            else:
                taps = head.layers_of(target.config.num_hidden_layers)
                feats = torch.cat([out.hidden_states[t][0] for t in taps], -1)
                pred = head(feats[None, : k - 1], embed(ids[None, 1:k]), torch.arange(k - 1)[None])[0, -1]
                z = torch.full((lm.shape[0],), float("-inf"))
                z[head.draft_to_target()] = head.draft_logits(pred)
            q = warper(z[None])[0]
            total += float(torch.minimum(row["p"][j], q[row["p_ids"][j]]).sum())
            n += 1
    return total / n


def test_each_head_is_scored_on_the_prefix_it_would_draft_from(tmp_path):
    target = tiny_llama(4, vocab=48, hidden=32, layers=8, heads=4, kv_heads=2, scale=3.0).eval()
    held = heldout(target)
    eagle = load_eagle_head(eagle_head_folder(target, tmp_path / "e", token_map=torch.arange(0, 48, 2), seed=1))
    eagle3 = load_eagle3_head(eagle3_head_folder(target, tmp_path / "e3", torch.arange(0, 48, 3), seed=2))
    seqs = [[(s + i) % 45 + 3 for i in range(16)] for s in range(4)]
    medusa = load_medusa_heads(
        medusa_heads_folder(target, tmp_path / "m", num_heads=2, sequences=seqs, steps=5), target
    )
    got = head_alphas(target, held, eagle=eagle, eagle3=eagle3, medusa=medusa)
    assert set(got) == {"eagle", "eagle3", "medusa"}
    for kind, head in (("eagle", eagle), ("eagle3", eagle3), ("medusa", medusa)):
        assert got[kind] == pytest.approx(reference(target, held, head, kind), abs=1e-5), kind
        assert 0.0 <= got[kind] <= 1.0
    assert head_alphas(target, held) == {} == head_alphas(target, held, eagle=None)
    with pytest.raises(TypeError, match=r"got \['ngram'\]"):
        head_alphas(target, held, ngram=eagle)  # a head kind it has no scoring for: refused, not skipped


def test_a_head_that_knows_the_answer_scores_one(tmp_path):
    """Medusa heads whose head 1 is the LM head one position on: on a model that copies, alpha is 1."""
    target = tiny_llama(5, vocab=48, hidden=32, layers=2, scale=3.0).eval()
    held = heldout(target, 2)
    medusa = load_medusa_heads(
        medusa_heads_folder(target, tmp_path / "m", num_heads=1), target
    )  # = the LM head at h_{k-2}
    got = head_alphas(target, held, medusa=medusa)["medusa"]
    assert got == pytest.approx(reference(target, held, medusa, "medusa"), abs=1e-5)
    # the LM head at h_{k-1} is the target's own row: the same rows give alpha 1 there
    shifted = {"rows": [{**r, "start": r["start"] + 1, "p": r["p"][1:], "p_ids": r["p_ids"][1:]} for r in held["rows"]]}
    with torch.no_grad():
        for r, full in zip(shifted["rows"], held["rows"]):
            logits = target(full["ids"][None]).logits[0, full["start"] - 2 : len(full["ids"]) - 2]
            p = Warper(1.0, 10, 0.9)(logits)[1:]
            r["p"], r["p_ids"] = p.topk(10, dim=-1)
    assert head_alphas(target, shifted, medusa=medusa)["medusa"] == pytest.approx(1.0, abs=1e-5)
