"""Benchmark: our decoders against transformers' generate() and assisted generation, and the bound.

    python -m pipeline.bench pair=smollm2-offline gamma=4 repeats=3

For every mode (greedy, sample) it times, on the same pair, prompts and settings:
transformers ``generate()`` (autoregressive), assisted generation where it can run
(``assistant_model=draft`` with ``num_assistant_tokens = gamma``, schedule ``constant``, confidence
threshold off, for ``drafter: model`` with a full-vocabulary draft head; ``prompt_lookup_num_tokens =
gamma``, ``max_matching_ngram_size = max_ngram`` for ``drafter: ngram``; a row says why not otherwise:
a restricted draft head, or EAGLE, which transformers does not run), and our ``ar``, ``spd``,
``block``, ``mtad`` with every drafter of ``drafters`` (``pair`` = the pair's configured drafter;
methods that cannot use a drafter get a row saying so). tokens/s is the median over ``repeats`` timed passes after
``warmup`` untimed ones. It also measures the single-token step time of the target (t_ar) and the
draft (t_draft), the time of one verification forward over gamma + 1 tokens (t_verify), the
acceptance rate alpha, and reports Leviathan's bound in both forms:

- ideal:    (1 - alpha^(g+1)) / ((1 - alpha)(g c + 1)),  c = t_draft / t_ar
- measured: E[tokens per step] * t_ar / (g t_draft + t_verify)

with efficiency = measured speedup over our ``ar`` / measured-cost bound, and the per-step
overhead outside the two models' forward passes. Results go to ``benchmarks/<name>.md|json``.

Energy (``energy_meter``, as the sweep's ``measure.energy_meter``: ``auto`` = NVML on a GPU, RAPL on a CPU
where readable, else none): every runner's pass over the prompts is one metered window, so each row has
J/token (median over passes), idle-subtracted with the idle power measured once before the passes
(``idle_seconds``); with ``nvml+zeus``, Zeus's reading of the same windows and ours against it per pass.

Modules: ``plan`` (settings and rows, before any model loads), ``runners`` (the timed passes, step costs, bounds),
``batched`` (``batch_sizes=[...]``: the batch-size table), ``serving`` (``workload=poisson|closed``: the serving
table), ``report`` (the Markdown tables), ``__main__`` (the
command line).
"""
