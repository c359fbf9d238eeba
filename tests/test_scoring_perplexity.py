"""Perplexity: teacher-forced NLL of generated tokens under the unwarped target, token-weighted."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest
import torch

from helpers.marks import require_kernels
from helpers.models import tiny_llama
from helpers.paths import REPO
from pipeline.scoring import perplexity as ppl


@pytest.fixture(scope="module")
def model():
    torch.set_num_threads(1)
    return tiny_llama(3, vocab=64, max_positions=4096, bos=1, eos=2, scale=8.0)


def test_nll_matches_transformers_loss(model):
    prompt, gen = [1, 5, 9, 12], [7, 7, 30, 2]
    nll, n = ppl.sequence_nll(model, prompt, gen)
    ids = torch.tensor([prompt + gen])
    labels = ids.clone()
    labels[0, : len(prompt)] = -100  # only the generated tokens are scored
    with torch.no_grad():
        loss = model(input_ids=ids, labels=labels).loss.item()
    assert n == 4
    assert nll == pytest.approx(loss * n, rel=1e-5)


def test_nll_is_unwarped_log_softmax(model):
    prompt, gen = [1, 4], [8, 9, 10]
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt + gen])).logits[0].double()
    logp = torch.log_softmax(logits, -1)
    expected = -sum(logp[len(prompt) - 1 + i, t].item() for i, t in enumerate(gen))
    assert ppl.sequence_nll(model, prompt, gen)[0] == pytest.approx(expected, rel=1e-5)
    chunked = ppl.sequence_nll(model, prompt, gen, chunk=1)[0]
    assert chunked == pytest.approx(expected, rel=1e-5)


def test_token_weighted_over_samples(model):
    pairs = [([1, 3], [4]), ([1, 3, 5], [6, 7, 8, 9, 10, 11])]
    result = ppl.perplexity(model, pairs)
    nlls = [ppl.sequence_nll(model, p, g) for p, g in pairs]
    assert result["tokens"] == 7
    assert result["score"] == pytest.approx(math.exp(sum(x for x, _ in nlls) / 7))
    per_sample_mean = sum(s["perplexity"] for s in result["per_sample"]) / 2
    assert result["score"] != pytest.approx(per_sample_mean)  # not the mean of per-sample figures


def test_empty_generation_and_empty_prompt(model):
    assert ppl.sequence_nll(model, [1, 2], []) == (0.0, 0)
    with pytest.raises(ValueError):
        ppl.sequence_nll(model, [], [3])
    assert math.isnan(ppl.perplexity(model, [([1], [])])["score"])


def test_cli_rescoring_with_the_offline_pair(tmp_path):
    records = [
        {"id": "a", "prompt_ids": [1, 9690, 198], "tokens": [28120, 28, 905, 2]},
        {"id": "b", "prompt_text": "The capital of France is", "prediction": " Paris."},
    ]
    path = tmp_path / "records.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "pipeline.scoring.perplexity",
            "--pair",
            "smollm2-offline",
            "--predictions",
            str(path),
            "--device",
            "cpu",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    result = json.loads(out.stdout)
    assert result["retokenised"] is True and result["tokens"] >= 5
    assert [d["id"] for d in result["per_sample"]] == ["a", "b"]
    assert 1.0 < result["score"] < 1e6


def test_a_bf16_target_on_the_kernels_is_scored_by_the_rows_it_served():
    """On the bf16 CPU kernels the pass is the engine's: each generated token's NLL is that of the row the
    engine computes one token at a time (batch invariance: bit for bit), and near transformers' bf16 forward."""
    from pipeline.decoding.fast_forward import lean_forward_for  # noqa: PLC0415
    from pipeline.decoding.kv import CachedModel  # noqa: PLC0415

    require_kernels()
    model = tiny_llama(5, vocab=64, max_positions=4096, bos=1, eos=2, scale=8.0).to(torch.bfloat16)
    assert lean_forward_for(model).kernel_path.startswith("bf16-")
    prompt, gen = [1, 5, 9, 12, 3], [7, 7, 30, 2, 44, 8]
    nll, n = ppl.sequence_nll(model, prompt, gen)
    stepper = CachedModel(model)
    stepper.prefill(prompt[:-1])
    expected = 0.0
    for t, tok in enumerate(gen):
        row = stepper.forward([(prompt + gen)[len(prompt) - 1 + t]])[-1]
        expected -= float(torch.log_softmax(row, -1)[tok])
    assert n == len(gen) and nll == pytest.approx(expected, rel=1e-6, abs=1e-6)
    ids = torch.tensor([prompt + gen])
    with torch.no_grad():
        ref = torch.log_softmax(model(input_ids=ids).logits[0].float(), -1)
    theirs = -sum(float(ref[len(prompt) - 1 + t, tok]) for t, tok in enumerate(gen))
    assert nll == pytest.approx(theirs, rel=0.05)
