"""Distil a small draft model for a pair's target (the code: ``pipeline.training.distill``).

python -m pipeline.distill pair=smollm2-offline              # conf/distill.yaml
"""

from __future__ import annotations

import os
import sys

import hydra
from omegaconf import DictConfig, open_dict

from pipeline.training.distill import run
from pipeline.training.shards import TeacherDataError


@hydra.main(config_path="../conf", config_name="distill", version_base="1.3")
def main(cfg: DictConfig) -> None:
    with open_dict(cfg):
        cfg.command_line = "python -m pipeline.distill " + " ".join(
            a for a in sys.argv[1:] if not a.startswith("hydra.")
        )
    try:
        run(cfg)
    except TeacherDataError as err:  # teacher data that cannot be trained on: one line naming the fix
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
