"""Training tools for the pipeline's own models (not part of a sweep; command lines in pipeline/*.py).

    teacher_data.py  offline prompts, the target's sampled answers and top-k log-probs (draft distillation)
    distill.py       distil a small draft for a pair's target (``python -m pipeline.distill``)
    medusa.py        train Medusa heads for a target (``python -m pipeline.train_medusa``)
    speed.py         tokens/s of the methods with a pair's draft on held-out prompts (``python -m pipeline.distill_speed``)
    cards.py         the model cards written next to the checkpoints
"""
