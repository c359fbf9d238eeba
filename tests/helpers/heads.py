"""Heads made on the fly for any target (tiny or the offline pair's), built and saved with the project's own
training and saving code: no head is shipped in models/ (none beat the distilled draft; docs/drafters.md)."""

from __future__ import annotations

from pathlib import Path

import torch

from pipeline.decoding.eagle import EagleHead, attach_eagle_head, eagle_config, save_eagle_head
from pipeline.decoding.eagle3 import save_eagle3_head
from pipeline.decoding.medusa_heads import MedusaHeads, save_medusa_heads
from pipeline.training.eagle3 import new_head
from pipeline.training.medusa import head_examples, train_heads


def with_eagle(model, seed: int = 7, embed: bool = False):
    """``model`` with a random (untrained) EAGLE-1/2 head attached, random but not tiny: its drafts differ from
    the target's rows."""
    torch.manual_seed(seed)
    head = EagleHead(eagle_config(model.config), embed_tokens=embed)
    with torch.no_grad():
        for p in head.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    head.token_map = None
    attach_eagle_head(model, head)
    return model


def eagle_head_folder(target, folder: Path, *, token_map: torch.Tensor | None = None, seed: int = 0) -> Path:
    """An EAGLE-1/2 head for ``target`` started as ``pipeline.training.eagle.run`` starts one (its decoder layer
    from the target's last layer, fc passing the feature through), saved by ``save_eagle_head``."""
    torch.manual_seed(seed)
    head = EagleHead(eagle_config(target.config), bias=True, embed_tokens=False)
    head.layers[0].load_state_dict(target.model.layers[-1].state_dict(), strict=False)
    h = target.config.hidden_size
    with torch.no_grad():
        torch.nn.init.zeros_(head.fc.bias)
        head.fc.weight.zero_()
        head.fc.weight[:, h:] = torch.eye(h)
        head.fc.weight[:, :h] = torch.randn(h, h) * 0.02
    return save_eagle_head(head, folder, token_map=token_map, dtype=torch.float32, note="made by a test")


def eagle3_head_folder(target, folder: Path, draft_ids: torch.Tensor, *, seed: int = 0, layout: str = "eagle") -> Path:
    """An EAGLE-3 head for ``target`` over ``draft_ids`` (``pipeline.training.eagle3.new_head``), saved by
    ``save_eagle3_head``."""
    head = new_head(target, draft_ids, init_from_target=True, seed=seed)
    return save_eagle3_head(head, folder, layout=layout, dtype=torch.float32)


@torch.no_grad()
def _hidden(target, sequences: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    hs = [target.get_decoder()(input_ids=torch.tensor([s])).last_hidden_state[0].float() for s in sequences]
    ids = torch.tensor([t for s in sequences for t in s])
    seq = torch.cat([torch.full((len(s),), i) for i, s in enumerate(sequences)])
    return torch.cat(hs), ids, seq


def medusa_heads_folder(
    target, folder: Path, *, num_heads: int = 2, sequences: list[list[int]] | None = None, steps: int = 0, seed: int = 0
) -> Path:
    """Medusa heads for ``target`` (zero-initialised ResBlocks: each head starts as the LM head), trained for
    ``steps`` by ``pipeline.training.medusa.train_heads`` on the target's own hidden states over ``sequences``,
    saved by ``save_medusa_heads``."""
    torch.manual_seed(seed)
    heads = MedusaHeads(target.config.hidden_size, num_heads)
    if steps and sequences:
        hidden, ids, seq = _hidden(target, sequences)
        with torch.enable_grad():
            train_heads(
                heads,
                target.get_output_embeddings(),
                hidden,
                head_examples(ids, seq, num_heads),
                steps=steps,
                batch_tokens=64,
                lr=1e-2,
                warmup=2,
                vocab=torch.unique(ids),
                seed=seed,
                log_every=0,
            )
    return save_medusa_heads(heads, folder, dtype=torch.float32, command="made by a test", seed=seed)
