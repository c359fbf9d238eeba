"""Every MLflow name the analysis depends on, in one place (tags, metrics, params, artifacts, records).

The layout is defined by ``pipeline/tracking/layout.py`` (tags, params, artifacts: their names are
imported from there), ``pipeline/measure/records.py`` (``WindowResult.summary`` and ``GenerationRecord``),
``pipeline/measure/energy.py::energy_summary`` and ``pipeline/cell.py`` (perplexity, score). The analysis uses
the canonical names on the left; when the pipeline renames something, change the right-hand side here
and nothing else.
"""

from __future__ import annotations

import math

from pipeline.decoding.base import METHODS, Decoder
from pipeline.scoring.registry import SCORERS
from pipeline.tracking.layout import (
    KIND_CELL,
    KIND_SWEEP,
    PARAM_PAIR_PREFIX,
    RESULT_ARTIFACT,
    SAMPLES_ARTIFACT,
    SCORE_DETAIL_FIELD,
    SCORES_ARTIFACT,
    STATUS_FINISHED,
    TAG_CELL_KEY,
    TAG_CODE_HASH,
    TAG_CONFIG_KEY,
    TAG_CPU_ISOLATION,
    TAG_DATASET,
    TAG_DEVICE,
    TAG_DRIVER_HOST,
    TAG_DRIVER_PID,
    TAG_ERROR,
    TAG_GIT_COMMIT,
    TAG_GPU_UUID,
    TAG_HEARTBEAT,
    TAG_HOSTNAME,
    TAG_KIND,
    TAG_LABEL,
    TAG_METHOD,
    TAG_NODE,
    TAG_PAIR,
    TAG_SCORE_DIRECTION,
    TAG_SCORE_METRIC,
    TAG_SCORE_SAMPLE_VALUE,
    TAG_SEED,
    TAG_STAGE,
    TAG_STATUS,
    TAG_SWEEP,
)

# ----------------------------------------------------------------------------------- runs and tags

# canonical column -> MLflow tag
TAGS: dict[str, str] = {
    "cell_key": TAG_CELL_KEY,
    "method": TAG_METHOD,  # the method's registry name (ar, spd, block, mtad, ...)
    "label": TAG_LABEL,  # the sweep entry's label: unique per method configuration (mtad(tau=0.3))
    "pair": TAG_PAIR,
    "dataset": TAG_DATASET,
    "seed": TAG_SEED,
    # finished | score_failed | failed; logging while its run is written (pipeline.tracking.layout)
    "status": TAG_STATUS,
    "stage": TAG_STAGE,
    "device": TAG_DEVICE,  # GPU name, or "cpu": ratios only compare cells on the same device model
    "gpu_uuid": TAG_GPU_UUID,
    "node": TAG_NODE,
    "hostname": TAG_HOSTNAME,
    "git_commit": TAG_GIT_COMMIT,  # HEAD, <HEAD>+dirty (code_hash names the code) or unknown
    "code_hash": TAG_CODE_HASH,
    "score_metric": TAG_SCORE_METRIC,  # pass@1 | execution_accuracy | rougeL | speed_only | none ...
    # the cell's scorer as the run logged it (a `module:attr` scorer too): its per-sample field and direction
    "score_sample_value": TAG_SCORE_SAMPLE_VALUE,
    "score_direction": TAG_SCORE_DIRECTION,
    "sweep": TAG_SWEEP,
    "error": TAG_ERROR,
}

# canonical column -> MLflow metric (a metric missing from a run is NaN in the DataFrame)
# a workload's latencies and rates (pipeline/measure/workload.py): timing, left out of disturbed cells (analysis.stats)
SERVING_TIMING = (
    *(f"{m}_p{q}" for m in ("ttft_s", "tpot_ms", "e2e_s", "queue_s") for q in (50, 90, 99)),
    "throughput_tok_s",
    "request_throughput_rps",
    "goodput_rps",
)
METRICS: dict[str, str] = {
    "tokens_per_s": "tokens_per_s",  # total new tokens / total decode time (the main speed column)
    "tokens_per_s_window": "tokens_per_s_window",
    "tokens_per_s_mean_of_samples": "tokens_per_s_mean_of_samples",
    "decode_s": "decode_s",
    "window_s": "window_s",
    "new_tokens": "new_tokens",
    "generations": "generations",
    "target_steps": "target_steps",
    "draft_steps": "draft_steps",
    # new tokens / target steps, pooled: tokens EMITTED per step (bonus token included), not accepted drafts
    # (accepted_drafts_per_step); the logged name is kept so every store already written reads the same
    "accepted_per_step": "accepted_per_step",
    "accepted_per_step_mean_of_samples": "accepted_per_step_mean_of_samples",
    # pipeline.measure.acceptance: vLLM / Spec-Bench conventions, pooled over tokens and per-request means
    "acceptance_length_pooled": "acceptance_length_pooled",
    "acceptance_length_per_request": "acceptance_length_per_request",
    "draft_acceptance_rate_pooled": "draft_acceptance_rate_pooled",
    "draft_acceptance_rate_per_request": "draft_acceptance_rate_per_request",
    "alpha_positions": "alpha_positions",  # i.i.d. MLE from the per-position counts
    "alpha_implied": "alpha_implied",  # from the acceptance length through Leviathan's formula
    "acceptance_falls": "acceptance_falls",  # 1: acceptance falls with draft position (z < -1.96)
    "perplexity": "perplexity",
    "score": "score",
    "energy_available": "energy_available",
    "energy_j": "energy_j",
    "j_per_token": "j_per_token",  # total board/package energy / tokens
    "dynamic_energy_j": "dynamic_energy_j",
    "dynamic_j_per_token": "dynamic_j_per_token",  # idle-subtracted
    "idle_power_w": "idle_power_w",
    "poller_energy_j": "poller_energy_j",
    "peak_memory_allocated_bytes": "peak_memory_allocated_bytes",
    # the cost model, read off the loop's own clock over the window (pipeline.measure.costs.cost_model): c = the draft
    # phase per draft position (a chain token, MTAD's beams' position, a tree level) over a plain target step, v = what
    # one more drafted position of every request adds to the verify phase over that step; without c the bound is "n/a"
    "cost_ratio": "cost_ratio_c",
    "row_cost_v": "row_cost_v",
    "row_slope_ms": "row_slope_ms",
    # where the window's time went, by the loop's clock: the four phases (summing to the loop's wall time) and shares
    "time_draft_s": "time_draft_s",
    "time_verify_s": "time_verify_s",
    "time_rule_s": "time_rule_s",
    "time_other_s": "time_other_s",
    "phase_share_draft": "phase_share_draft",
    "phase_share_verify": "phase_share_verify",
    "phase_share_rule": "phase_share_rule",
    "phase_share_other": "phase_share_other",
    "iterations": "iterations",
    "rows_per_iteration": "rows_per_iteration",
    "context_mean": "context_mean",
    "clock_transitions": "clock_transitions",
    # tokens/s in units of the window's own plain target step: a speed that machine phases between cells cancel in
    "tokens_per_target_step": "tokens_per_target_step",
    # the speedup over ar if rule and other cost nothing: tokens per second of model work (draft + verify) over a plain
    # step's (measure.costs.cost_model); efficiency = speedup_normalized / speedup_bound
    "speedup_bound": "speedup_bound",
    # the window's own step moved (its in-loop plain steps quarter by quarter, its probes): measure.costs.step_drift
    "step_drift": "step_drift",
    # what the configured method drafted (pipeline.decoding.base.Capabilities): positions per step (a chain's
    # gamma, a tree's levels) and 1 for a tree; absent for a method that drafts nothing (and in older stores)
    "draft_depth": "draft_depth",
    "tree_draft": "tree_draft",
    # a plain target step at the window's batch and contexts (the loop's clock); the mean pass of a drafting iteration,
    # the draft phase per position; the probes (pipeline.measure.costs.probe_step_ms) just before and just after the
    # window; older stores: what a calibrating cell measured before its window, the sweep-start calibration
    "t_target_step_ms": "t_target_step_ms",
    "t_verify_ms": "t_verify_ms",
    "t_draft_step_ms": "t_draft_step_ms",
    "calibrated_draft_cost": "calibrated_draft_cost",
    "calibrated_verify_cost": "calibrated_verify_cost",
    "cell_wall_s": "cell_wall_s",
    "probe_before_ms": "probe_before_ms",
    "probe_after_ms": "probe_after_ms",
    "calibrated_target_step_ms": "calibrated_target_step_ms",
    "step_slowdown": "step_slowdown",
    "disturbed": "disturbed",  # 1: step_drift >= measure.DISTURBED_DRIFT (older: probe >= 1.5x calibration): timing out
    # a workload's cells (pipeline/measure/workload.py; absent offline): the offered load and what it met
    **{name: name for name in ("rate", *SERVING_TIMING, "mean_batch_occupancy")},
}

# Params under this prefix describe the pair (models, draft, dtype...): runs whose pair config differs
# under one pair name are told apart in the tables ("<pair>@<fingerprint>"), never pooled.
PAIR_PARAM_PREFIX = PARAM_PAIR_PREFIX

# A label's configuration, what its runs pool over seeds by (column ``config``): the hash of the cell's identity
# without its seed (``Cell.config_key``, tag below) and the CPU isolation mode it ran under (tag below); runs
# logged before the tag existed fall back to their params, less those that are not part of a cell's identity.
CONFIG_KEY_TAG = TAG_CONFIG_KEY
ISOLATION_TAG = TAG_CPU_ISOLATION
NOT_IDENTITY_PARAMS = ("cell_key", "sweep", "label", "seed", "judge", "method.config", "pair.device", "dataset.path")
NOT_IDENTITY_PREFIXES = ("judge.", "isolation.", "dataset.task.")  # dataset.task.version is: see analysis.runs


def _scalar_method_params() -> dict[str, str]:
    """Every scalar parameter (number, bool, text) a registered method declares, warping first, each under its own
    name -> its flattened cell-config param ``method.<name>``; the ``drafter`` scope is flattened under its keys
    (``method.drafter.kind``) and is not a column of its own."""
    out: dict[str, str] = {}
    for _, cls in METHODS.items():
        for key, param in cls.all_params().items():
            if isinstance(param.default, (int, float, bool, str)):
                if key != "drafter" and key not in out:
                    out[key] = f"method.{key}"
    return out


def _ablation_params() -> tuple[str, ...]:
    """The numeric parameters (not bool, not warping) of the registered methods: their variation within one method
    makes an ablation curve (a parameter that does not vary draws none)."""
    warping = set(Decoder.all_params())
    found = {
        key: None
        for _, cls in METHODS.items()
        for key, param in cls.params.items()
        if key not in warping and isinstance(param.default, (int, float)) and not isinstance(param.default, bool)
    }
    return tuple(found)


# canonical column -> flattened cell-config param (values arrive as text and are parsed): the method's name, every
# scalar parameter the registered methods declare, and the cell's own settings. Each run's own scalar ``method.<key>``
# params join these as columns too (``analysis.runs.load_runs``): a `module:attr` method's parameters are read from
# its runs, not from this process's registry; the registered ones are here so that every frame has their columns.
METHOD_PARAM_PREFIX = "method."
PARAMS: dict[str, str] = {
    "method_name": "method.name",
    **_scalar_method_params(),
    "max_new_tokens": "dataset.max_new_tokens",
    "limit": "dataset.limit",
    "hardware": "hardware",
    "harness_version": "harness_version",
    "batch_size": "batch_size",  # requests decoded together (harness 5 on; older cells: 1)
    "k_config": "method.k_config",  # a tree method's children per depth
    "draft_stop": "method.draft_stop",
}

# ----------------------------------------------------------------------------------- artifacts

# SAMPLES_ARTIFACT (one record per generation), RESULT_ARTIFACT and SCORES_ARTIFACT: pipeline.tracking.layout
__all__ = [
    "KIND_CELL",
    "KIND_SWEEP",
    "RESULT_ARTIFACT",
    "SAMPLES_ARTIFACT",
    "SCORE_DETAIL_FIELD",
    "SCORES_ARTIFACT",
    "STATUS_FINISHED",
    "TAG_DRIVER_HOST",  # a parent run's driver: pid, host and heartbeat (analysis.runs.driver_gone)
    "TAG_DRIVER_PID",
    "TAG_HEARTBEAT",
    "TAG_KIND",
]

# canonical column -> field of a samples.jsonl record
RECORD_FIELDS: dict[str, str] = {
    "id": "id",
    "turn": "turn",
    "new_tokens": "new_tokens",
    "steps": "steps",
    "draft_steps": "draft_steps",
    "accepted": "accepted",  # tokens EMITTED per iteration (bonus included); name kept for the stores written
    "drafted": "drafted",  # draft positions put to the target per step (speculative methods; older records: absent)
    "decode_s": "decode_s",
    "tokens_per_s": "tokens_per_s",
    "perplexity": "perplexity",
    "category": "category",  # the sample's category (analysis/categories.py: per-category tables)
}
# SCORE_DETAIL_FIELD: a record's verdicts (the fields its task's scorer declares, conf/dataset/<name>.yaml
# `score_fields`). A sample's score is the field its run logged as its scorer's per-sample value (tag
# ``score_sample_value``, ``Scorer.sample_value``); for runs logged before that tag, the first present of the
# registered scorers' values (HumanEval ``passed``, Spider ``correct``, ROUGE ``rougeL``, the judge's ``score``)
SCORE_DETAIL_KEYS = tuple(dict.fromkeys(s.sample_value for _, s in SCORERS.items() if s.sample_value))

# ----------------------------------------------------------------------------------- methods

BASELINE = "ar"  # speedup and energy ratio are taken against this method's cells (docs/DESIGN.md 5.8)
# Column order of the tables: the methods' registration order (MTAD Table 5 order first, then methods added
# later); methods this installation does not know follow alphabetically.
METHOD_ORDER = tuple(METHODS.names())
# Hyper-parameters whose variation within one method makes an ablation curve: the methods' numeric parameters.
ABLATION_PARAMS = _ablation_params()


def draft_of(method: str, draft_depth: float, tree_draft: float, gamma: float) -> tuple[str, int | None]:
    """What a cell drafted, ``(shape, depth)``: ``chain`` / ``tree`` with its positions per step, or ``("none",
    None)``. Cells log it as configured (metrics ``draft_depth`` and ``tree_draft``, ``Decoder.capabilities_of``:
    a ``typical`` cell with ``tree: true`` drafts trees); a cell logged before those metrics had a chain of its
    ``gamma`` param when its method's class declared a chain, which is what is read for it. A method this
    installation does not know (a store written elsewhere) without those metrics has none."""
    if draft_depth is not None and math.isfinite(float(draft_depth)):
        tree = tree_draft is not None and math.isfinite(float(tree_draft)) and float(tree_draft) > 0
        return ("tree" if tree else "chain"), int(draft_depth)
    try:
        declared = METHODS.get(method).draft_shape
    except ValueError:
        return "none", None
    if declared == "chain" and gamma is not None and math.isfinite(float(gamma)):
        return "chain", int(gamma)
    return "none", None


def _score_direction() -> int:
    """+1 when every registered scorer declares higher is better, -1 when every one declares lower, else 0."""
    higher = {s.higher_is_better for _, s in SCORERS.items()}
    return 0 if len(higher) != 1 else (+1 if higher == {True} else -1)


def direction(metric: str, runs=None) -> int:
    """Whether higher (+1) or lower (-1) is better for ``metric``, 0 when the runs disagree (no best marked). The
    score's is what the runs logged of their scorers (column ``score_direction``); runs logged before that tag fall
    back to the registered scorers' (``DIRECTION``)."""
    if metric == "score" and runs is not None and "score_direction" in runs:
        logged = {str(v) for v in runs["score_direction"].dropna() if str(v) in ("1", "-1")}
        if logged:
            return int(logged.pop()) if len(logged) == 1 else 0
    return DIRECTION.get(metric, 1)


def ablation_params(runs=None) -> tuple[str, ...]:
    """The ablation columns: the registered methods' numeric parameters, then those the runs logged beyond them
    (``runs.attrs["method_numeric_params"]``, set by ``analysis.runs.load_runs``: a `module:attr` method's)."""
    logged = [] if runs is None else list(runs.attrs.get("method_numeric_params", ()))
    return tuple(dict.fromkeys([*ABLATION_PARAMS, *logged]))


# higher is better (+1) or lower is better (-1), for bold/underline
DIRECTION: dict[str, int] = {
    "tokens_per_s": +1,
    "j_per_token": -1,
    "dynamic_j_per_token": -1,
    # the scorers declare their direction (``Scorer.higher_is_better``); 0 (no best marked) if they disagree
    "score": _score_direction(),
    "perplexity": -1,
    "speedup": +1,
    "energy_ratio": -1,
    "accepted_per_step": +1,
}

# how a column is shown in tables and on axes
DISPLAY: dict[str, str] = {
    "tokens_per_s": "tokens/s",
    "j_per_token": "J/token",
    "dynamic_j_per_token": "J/token (idle-subtracted)",
    "score": "score",
    "perplexity": "perplexity",
    "speedup": "speedup vs ar",
    "energy_ratio": "J/token ÷ ar",
    "accepted_per_step": "tokens/step",
    "accepted_drafts_per_step": "accepted drafts/step",
}
