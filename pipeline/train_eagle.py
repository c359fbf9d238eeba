"""Train an EAGLE head for a pair's target: EAGLE-1/2 (``pipeline.training.eagle``, conf/train_eagle.yaml) or
EAGLE-3 (``pipeline.training.eagle3``, conf/train_eagle3.yaml: ``head.version: 3``).

    python -m pipeline.train_eagle pair=smollm2-offline                             # -> models/smollm2-135m-eagle/
    python -m pipeline.train_eagle pair=smollm2-offline head=eagle3                 # -> models/smollm2-135m-eagle3/
    python -m pipeline.train_eagle --config-name train_eagle3 pair=smollm2-offline  # the same

``head=eagle3`` swaps in conf/train_eagle3.yaml, the command line's other overrides applied to it.
"""

from __future__ import annotations

import json
import sys
from typing import cast

import hydra
from hydra import compose
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from pipeline.training import eagle, eagle3


def training_config(cfg: DictConfig, overrides: list[str]) -> dict:
    """The resolved training config: ``head=eagle3`` (the short form) swaps in conf/train_eagle3.yaml with
    the command line's other ``overrides`` applied to it (Hydra must be initialised, as under ``main``)."""
    if cfg.get("head") == "eagle3":
        cfg = compose("train_eagle3", overrides=[o for o in overrides if o != "head=eagle3"])
    return cast(dict, OmegaConf.to_container(cfg, resolve=True))


@hydra.main(version_base="1.3", config_path="../conf", config_name="train_eagle")
def main(cfg: DictConfig) -> None:
    c = training_config(cfg, list(HydraConfig.get().overrides.task))
    c["command"] = "python -m pipeline.train_eagle " + " ".join(sys.argv[1:])
    run = eagle3.run if int(c["head"].get("version", 2)) == 3 else eagle.run
    info = run(c)
    print(json.dumps(info["heldout_alpha_curve"][-1], indent=2))


if __name__ == "__main__":
    main()
