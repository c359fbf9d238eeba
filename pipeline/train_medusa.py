"""Train Medusa heads for a pair's target (the code: ``pipeline.training.medusa``).

python -m pipeline.train_medusa pair=smollm2-offline            # -> models/smollm2-135m-medusa/
"""

from __future__ import annotations

import json
import sys
from typing import Any, cast

import hydra
from omegaconf import DictConfig, OmegaConf

from pipeline.training.medusa import run


@hydra.main(version_base="1.3", config_path="../conf", config_name="train_medusa")
def main(cfg: DictConfig) -> None:
    c = cast(dict[str, Any], OmegaConf.to_container(cfg, resolve=True))
    c["command"] = "python -m pipeline.train_medusa " + " ".join(sys.argv[1:])
    info = run(c)
    print(json.dumps(info["heldout_top1"], indent=2))


if __name__ == "__main__":
    main()
