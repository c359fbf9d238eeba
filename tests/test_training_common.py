"""The training tools' shared parts: the offline teacher data (one copy), run setup, the schedule, head checkpoints."""

from __future__ import annotations

import hashlib
import json
import math

import pytest
import torch
from safetensors.torch import save_file

from helpers.models import tiny_llama
from helpers.tokenizers import word_tokenizer
from pipeline.decoding.checkpoints import attach, place, read_checkpoint
from pipeline.prompts import chat_ids
from pipeline.training.common import repo_path, scheduled_steps, start_run, warmup_cosine
from pipeline.training.prompt_sets import build_prompts, feature_prompts
from pipeline.training.teacher_data import build_tf_sequences, left_pad, padding_id


def test_feature_prompts_are_those_the_shipped_heads_were_trained_on():
    """models/smollm2-135m-{medusa,eagle} were trained on these prompts (seed 0): the list must not drift."""
    train, held = feature_prompts(0)
    assert len(train) == 200 and len(held) == 16 and not set(train) & set(held)
    assert train[0] == "Write a haiku and then a short explanation about the immune response."
    assert held[0] == "What are the pros and cons of rainbows?"
    assert hashlib.sha256(json.dumps([train, held]).encode()).hexdigest()[:16] == "a69529adfaa9e67e"
    assert feature_prompts(1) != (train, held)


def test_distillation_prompts_follow_the_seed_only():
    assert build_prompts(40, 3) == build_prompts(40, 3)
    assert build_prompts(40, 3) != build_prompts(40, 4)


def test_teacher_forced_sequences_are_chat_prompt_then_answer_and_eos():
    tok = word_tokenizer()
    probe = chat_ids(tok, "x")
    opening = probe[probe.index(tok.convert_tokens_to_ids("x")) + 1 :]  # end of the user turn + the assistant opening
    seqs = build_tf_sequences(tok, 4, 0, 4096)
    assert len(seqs) == 4
    for ids, start in seqs:
        assert ids[-1] == tok.eos_token_id and len(ids) - start >= 16
        assert ids[start - len(opening) : start] == opening  # the answer starts right after the assistant opening


def test_left_pad_puts_every_prompt_against_the_right_edge():
    ids, mask = left_pad([[5, 6, 7], [8]], pad=0)
    assert ids.tolist() == [[5, 6, 7], [0, 0, 8]] and mask.tolist() == [[1, 1, 1], [0, 0, 1]]
    assert ids.dtype == torch.long

    class Tok:
        pad_token_id, eos_token_id = None, 2

    assert padding_id(Tok()) == 2


def test_start_run_logs_to_the_work_folder_and_echoes_what_it_is_told(tmp_path, capsys):
    job = start_run(threads=1, seed=5, work_dir=tmp_path / "w", echo=lambda msg: not msg.startswith("step "))
    a = torch.rand(3)
    job.log("step 1/10 loss 2.0")
    job.log("saved")
    torch.manual_seed(5)
    assert torch.equal(a, torch.rand(3))  # start_run set the global seed
    lines = (tmp_path / "w" / "train.log").read_text().splitlines()
    assert [line.split("] ", 1)[1] for line in lines] == ["step 1/10 loss 2.0", "saved"]
    out = capsys.readouterr().out
    assert "saved" in out and "step 1/10" not in out
    assert repo_path("models/x") == repo_path(repo_path("models/x")) and repo_path("models/x").is_absolute()


def test_scheduled_steps_set_the_rate_and_stop_as_asked():
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    logged = []
    seen = [
        (step, rate, opt.param_groups[0]["lr"])
        for step, rate in scheduled_steps(opt, lr=0.1, warmup=2, steps=6, stop_after=4, log=logged.append)
    ]
    assert [s for s, _, _ in seen] == [1, 2, 3, 4]
    assert all(rate == group_lr == warmup_cosine(0.1, s, 2, 6) for s, rate, group_lr in seen)
    assert seen[0][1] == pytest.approx(0.05 * 0.5 * (1 + math.cos(math.pi / 6)))
    assert logged == ["stop_after_steps reached at step 4 (the schedule stays that of 6 steps)"]
    logged.clear()
    assert list(scheduled_steps(opt, lr=0.1, warmup=2, steps=6, deadline=0.0, log=logged.append)) == []
    assert logged == ["time budget reached at step 1"]


def test_head_checkpoints_read_safetensors_or_bin_and_name_the_trainer(tmp_path):
    with pytest.raises(ValueError, match=r"no EAGLE head at .*python -m pipeline.train_eagle"):
        read_checkpoint(
            tmp_path,
            config_file="config.json",
            weights_files=("model.safetensors", "pytorch_model.bin"),
            what="EAGLE head",
            trainer="train_eagle",
        )
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 4}))
    kw = dict(
        config_file="config.json",
        weights_files=("model.safetensors", "pytorch_model.bin"),
        what="EAGLE head",
        trainer="train_eagle",
    )
    with pytest.raises(ValueError, match="none of"):
        read_checkpoint(tmp_path, **kw)
    torch.save({"w": torch.ones(2)}, tmp_path / "pytorch_model.bin")
    _, config, state = read_checkpoint(tmp_path, **kw)
    assert config == {"hidden_size": 4} and torch.equal(state["w"], torch.ones(2))
    save_file({"w": torch.zeros(2)}, tmp_path / "model.safetensors")  # preferred when both exist
    assert torch.equal(read_checkpoint(tmp_path, **kw)[2]["w"], torch.zeros(2))


def test_place_and_attach_check_the_width_and_keep_the_targets_state_dict():
    target = tiny_llama(0, vocab=32, hidden=32)
    head = torch.nn.Linear(32, 32)
    head.hidden_size = 32
    keys = set(target.state_dict())
    assert place(target, head, "Test head") is head and not hasattr(target, "extra_head")  # placed, not attached
    assert attach(target, head, "extra_head", "Test head") is target and target.extra_head is head
    assert set(target.state_dict()) == keys
    narrow = torch.nn.Linear(16, 16)
    narrow.hidden_size = 16
    for call in (lambda: place(target, narrow, "Test head"), lambda: attach(target, narrow, "other_head", "Test head")):
        with pytest.raises(ValueError, match="Test head expects hidden size 16, the target has 32"):
            call()
