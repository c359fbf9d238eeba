"""Tokens/s of decoding methods with a pair's draft on held-out prompts (the code: ``pipeline.training.speed``).

python -m pipeline.distill_speed --pair smollm2-offline --repeats 3  # --methods: the bench's (conf/bench.yaml)
"""

from __future__ import annotations

from pipeline.training.speed import main

if __name__ == "__main__":
    main()
