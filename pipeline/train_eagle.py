"""Train an EAGLE-1/2 head for a pair's target (the code: ``pipeline.training.eagle``).

    python -m pipeline.train_eagle pair=smollm2-offline            # -> models/smollm2-135m-eagle/
"""

from __future__ import annotations

import json
import sys

import hydra
from omegaconf import DictConfig, OmegaConf

from pipeline.training.eagle import run


@hydra.main(version_base="1.3", config_path="../conf", config_name="train_eagle")
def main(cfg: DictConfig) -> None:
    c = OmegaConf.to_container(cfg, resolve=True)
    c["command"] = "python -m pipeline.train_eagle " + " ".join(sys.argv[1:])
    info = run(c)
    print(json.dumps(info["heldout_alpha_curve"][-1], indent=2))


if __name__ == "__main__":
    main()
