"""Held-out first-token alpha of every drafter of a pair on the same positions: the draft model, EAGLE-1/2
and EAGLE-3 heads, Medusa's first head. A head is worth shipping only if it beats the draft here.

    python -m pipeline.training.drafter_alpha --work .cache/distill/<run> --draft models/smollm2-135m-draft \\
        --eagle <folder> --eagle3 <folder> --medusa <folder>

The held-out sets are those a distillation run built (``pipeline.training.distill_heldout.heldout_sets``:
``heldout-*.pt`` in its work folder): target-sampled answers with the target's warped rows ``p`` (T = 1,
top-k 10, top-p 0.9) at every answer position. At the answer position that predicts token ``k`` from
the true prefix, each drafter's warped row ``q`` is scored by ``sum_v min(p_v, q_v)`` (the acceptance of
its first drafted token), averaged over all answer positions:

- draft model: its logits over the prefix (restricted head as the engine runs it: ``evaluate_alpha``);
- EAGLE-1/2: ``head(f_{k-2}, emb(x_{k-1}))`` -> predicted feature -> the target's LM head (its
  restricted map, if any);
- EAGLE-3: ``head(taps_{k-2}, emb(x_{k-1}))`` -> its own norm and LM head over the draft vocabulary;
- Medusa: head 1 on ``h_{k-2}`` (it proposes the token after the target's own next one).

The heads read the frozen float32 target's features, as they were trained.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import cast

import torch
from transformers import AutoModelForCausalLM

from pipeline.decoding.eagle import load_eagle_head
from pipeline.decoding.eagle3 import load_eagle3_head
from pipeline.decoding.medusa_heads import load_medusa_heads
from pipeline.decoding.vocab import read_token_map
from pipeline.decoding.warping import Warper
from pipeline.training.common import load_frozen_target, repo_path
from pipeline.training.distill_heldout import evaluate_alpha

WARPER = Warper(1.0, 10, 0.9)


def _score(q: torch.Tensor, row: dict) -> float:
    """sum over positions of sum_v min(p_v, q_v), ``q [n, V]`` warped over the full vocabulary."""
    return float(torch.minimum(row["p"], q.gather(-1, row["p_ids"])).sum())


@torch.no_grad()
def head_alphas(target, heldout: dict, **heads) -> dict[str, float]:
    """First-token alpha of each given head over ``heldout``'s answer positions (see the module doc): ``heads`` by
    their drafter kind, ``eagle=``, ``eagle3=``, ``medusa=`` (a None one is left out); an alpha per head given."""
    given = {name: head for name, head in heads.items() if head is not None}
    sums = dict.fromkeys(given, 0.0)
    eagle, eagle3, medusa = given.pop("eagle", None), given.pop("eagle3", None), given.pop("medusa", None)
    if given:
        raise TypeError(f"head_alphas scores EAGLE, EAGLE-3 and Medusa heads; got {sorted(given)}")
    embed = target.get_input_embeddings()
    lm = target.get_output_embeddings().weight
    vocab = lm.shape[0]
    n = 0
    taps = eagle3.layers_of(target.config.num_hidden_layers) if eagle3 is not None else ()
    for row in heldout["rows"]:
        ids, start = row["ids"].long(), row["start"]
        if start < 2:
            raise ValueError("a held-out answer needs two tokens of prompt before it")
        out = target.get_decoder()(input_ids=ids[None], output_hidden_states=eagle3 is not None)
        last = out.last_hidden_state[0].float()
        sel = torch.arange(start - 2, len(ids) - 2)  # the feature row two before each answer token
        # the heads run over the whole sequence (feature f_t with the embedding of x_{t+1}), causally
        if eagle is not None:
            pred = eagle(
                last[None, : len(ids) - 2], embed(ids[None, 1 : len(ids) - 1]), torch.arange(len(ids) - 2)[None]
            )[0][sel]
            token_map = getattr(eagle, "token_map", None)
            z = pred @ (lm if token_map is None else lm[token_map]).T
            if token_map is not None:
                z = torch.full((len(sel), vocab), float("-inf")).index_copy_(-1, token_map, z)
            sums["eagle"] += _score(WARPER(z.float()), row)
        if eagle3 is not None:
            feats = torch.cat([out.hidden_states[t][0] for t in taps], -1).float()
            pred = eagle3(
                feats[None, : len(ids) - 2], embed(ids[None, 1 : len(ids) - 1]), torch.arange(len(ids) - 2)[None]
            )[0][sel]
            z = torch.full((len(sel), vocab), float("-inf"))
            z[:, eagle3.draft_to_target()] = eagle3.draft_logits(pred).float()
            sums["eagle3"] += _score(WARPER(z), row)
        if medusa is not None:
            z = medusa(last[sel], target.get_output_embeddings())[0]
            sums["medusa"] += _score(WARPER(z.float()), row)
        n += len(sel)
    return {k: v / max(n, 1) for k, v in sums.items()}


def compare(
    pair_cfg: dict,
    heldouts: dict[str, dict],
    *,
    draft: str | None = None,
    eagle: str | None = None,
    eagle3: str | None = None,
    medusa: str | None = None,
) -> dict[str, dict[str, float]]:
    """``{held-out set: {drafter: alpha}}`` for the draft model and every head folder given."""
    _, target, _ = load_frozen_target(pair_cfg)
    heads = dict(
        eagle=load_eagle_head(repo_path(eagle)) if eagle else None,
        eagle3=load_eagle3_head(repo_path(eagle3)) if eagle3 else None,
        medusa=load_medusa_heads(repo_path(medusa), target) if medusa else None,
    )
    student = token_map = None
    if draft:
        student = AutoModelForCausalLM.from_pretrained(repo_path(draft), dtype=torch.float32).eval()
        token_map = read_token_map(repo_path(draft))
    out = {}
    for name, held in heldouts.items():
        res = head_alphas(target, held, **heads)
        if student is not None:
            res = {"model": evaluate_alpha(student, held, token_map)["alpha"], **res}
        res["positions"] = sum(len(r["p"]) for r in held["rows"])
        out[name] = res
    return out


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--work", required=True, help="a distillation work folder (its heldout-*.pt sets)")
    ap.add_argument("--pair", default="smollm2-offline")
    ap.add_argument("--draft")
    ap.add_argument("--eagle")
    ap.add_argument("--eagle3")
    ap.add_argument("--medusa")
    ap.add_argument("--out", help="write the figures here (JSON)")
    args = ap.parse_args(argv)
    files = sorted(repo_path(args.work).glob("heldout-*.pt"))
    if not files:
        raise SystemExit(f"no heldout-*.pt in {args.work}: run python -m pipeline.distill (stop_after=data) first")
    from omegaconf import OmegaConf  # noqa: PLC0415 - only the command line reads the pair's file

    pair_cfg = cast(
        dict, OmegaConf.to_container(OmegaConf.load(repo_path(f"conf/pair/{args.pair}.yaml")), resolve=True)
    )
    heldouts = {f.stem: torch.load(f) for f in files}
    res = compare(pair_cfg, heldouts, draft=args.draft, eagle=args.eagle, eagle3=args.eagle3, medusa=args.medusa)
    text = json.dumps(res, indent=1)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return res


if __name__ == "__main__":
    torch.set_num_threads(2)
    main()
