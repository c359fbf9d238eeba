"""Decode one prompt with one method and one pair; print the text and the stats as JSON.

python -m pipeline.generate method=mtad method.tau=0.3 pair=smollm2-offline prompt="Hello"
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any, cast

import hydra
from omegaconf import DictConfig, OmegaConf

from pipeline.decoding import build_decoder, check_method, make_generator
from pipeline.device import synchronize
from pipeline.models import ModelNotAvailableError, PairSpec, drafter_context, load_pair
from pipeline.prompts import encode_prompt, eos_ids


def method_params(method_cfg: DictConfig | dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """Split a ``conf/method/<name>.yaml`` mapping into (name, decoder parameters)."""
    cfg = (
        cast(dict[str, Any], OmegaConf.to_container(method_cfg, resolve=True))
        if isinstance(method_cfg, DictConfig)
        else dict(method_cfg)
    )
    name = cfg.pop("name")
    return name, cfg


def check_inputs(cfg: DictConfig) -> None:
    """``prompt``, ``max_new_tokens`` and ``seed`` checked before anything loads (ValueError naming the fix)."""
    prompt, max_new, seed = cfg.get("prompt"), cfg.get("max_new_tokens"), cfg.get("seed")
    if not isinstance(prompt, str):
        raise ValueError(
            f"prompt must be a string, got {type(prompt).__name__} {prompt!r}; quote it for Hydra, "
            f"e.g. prompt='\"{prompt}\"'"
        )
    if not prompt.strip():
        raise ValueError('prompt is empty; pass some text, e.g. prompt="Hello"')
    if isinstance(max_new, bool) or not isinstance(max_new, int) or max_new < 1:
        raise ValueError(f"max_new_tokens must be an integer >= 1, got {max_new!r}; e.g. max_new_tokens=128")
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**63:
        raise ValueError(f"seed must be an integer in [0, 2**63), got {seed!r}; e.g. seed=0")


def run(cfg: DictConfig) -> dict[str, Any]:
    check_inputs(cfg)  # before any model is loaded
    name, params = method_params(cfg.method)
    pair_spec = PairSpec.from_config(cast(dict[str, Any], OmegaConf.to_container(cfg.pair, resolve=True)))
    check_method(name, params, drafters=drafter_context(pair_spec))  # before any model is loaded
    pair = load_pair(pair_spec)
    decoder = build_decoder(name, pair.target, pair.draft, assets=pair.assets, **params)
    ids = encode_prompt(pair.tokenizer, cfg.prompt, pair_spec.chat)
    device = next(pair.target.parameters()).device
    gen = make_generator(cfg.seed, device)
    start = time.perf_counter()
    out = decoder.generate(
        ids, max_new_tokens=cfg.max_new_tokens, eos_token_ids=eos_ids(pair.tokenizer, pair.target), generator=gen
    )
    synchronize(device)
    elapsed = time.perf_counter() - start
    return {
        "method": name,
        "params": decoder.config,
        "pair": pair_spec.name,
        "prompt_tokens": len(ids),
        "text": pair.tokenizer.decode(out.tokens, skip_special_tokens=True),
        "new_tokens": len(out.tokens),
        "steps": out.steps,
        "draft_steps": out.draft_steps,
        "accepted": out.accepted,
        "tokens_per_step": len(out.tokens) / max(out.steps, 1),
        "seconds": round(elapsed, 4),
        "tokens_per_s": round(len(out.tokens) / elapsed, 2),
    }


@hydra.main(version_base="1.3", config_path="../conf", config_name="generate")
def main(cfg: DictConfig) -> None:
    try:
        result = run(cfg)
    except (ValueError, ModelNotAvailableError) as err:  # bad input, or a model this machine cannot load: one line
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
    print(result["text"])
    print(json.dumps({k: v for k, v in result.items() if k != "text"}))


if __name__ == "__main__":
    main()
