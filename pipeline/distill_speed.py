"""Tokens/s of decoding methods with a pair's draft on held-out prompts (the code: ``pipeline.training.speed``).

python -m pipeline.distill_speed --pair smollm2-offline --methods ar spd block mtad --repeats 3
"""

from __future__ import annotations

from pipeline.training.speed import main

if __name__ == "__main__":
    main()
