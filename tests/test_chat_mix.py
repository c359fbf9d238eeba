"""The chat prompt mix of draft distillation, its held-out split, the evaluation-prompt check, and the
multi-turn teacher data built from it (tiny models, a word-level tokenizer: no download)."""

from __future__ import annotations

import json
from collections import Counter

import pytest
import torch

from helpers.models import tiny_llama
from helpers.teacher import small_chat_run
from helpers.tokenizers import word_tokenizer
from pipeline.decoding.kv import CachedModel
from pipeline.prompts import encode_prompt
from pipeline.training import chat_mix_words, teacher_data
from pipeline.training.chat_mix import CATEGORY_WEIGHTS, MULTI_TURN, Conversation, Pools, chat_conversations
from pipeline.training.contamination import contaminated, evaluation_prompts, refuse_evaluation_prompts
from pipeline.training.distill_heldout import build_heldout
from pipeline.training.prompt_sets import build_prompts
from pipeline.training.shards import load_records
from pipeline.training.teacher_data import (
    chat_heldout_conversations,
    generate_teacher_data,
    sample_answers_packed,
    sample_conversations,
)


def test_the_mix_covers_the_chat_benchmark_categories_in_their_proportions():
    convs = chat_conversations(4000, 0)
    assert convs == chat_conversations(4000, 0) and convs != chat_conversations(4000, 1)  # the seed, only
    assert chat_conversations(100, 0) == convs[:100]  # a prefix of a longer run is the shorter run
    counts = Counter(c.category for c in convs)
    for cat, w in CATEGORY_WEIGHTS.items():
        assert abs(counts[cat] / len(convs) - w) < 0.025, (cat, counts[cat])
    assert {"writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities"} <= set(counts)
    two = sum(len(c.turns) == 2 for c in convs) / len(convs)
    assert abs(two - MULTI_TURN) < 0.03
    assert len({c.turns[0] for c in convs}) > 0.6 * len(convs)  # templated, but mostly distinct
    assert all(t.strip() for c in convs for t in c.turns)


def test_the_heldout_split_uses_items_training_never_sees():
    pools_train, pools_held = Pools("train"), Pools("heldout")
    items = list(range(23))
    assert sorted(pools_train.part(items) + pools_held.part(items)) == items
    assert not set(pools_train.part(items)) & set(pools_held.part(items))
    assert pools_held.part([1, 2, 3]) == [1, 2, 3]  # short lists are shared
    held_personas = set(pools_held.part(chat_mix_words.PERSONAS))
    train = chat_conversations(3000, 0)
    held = chat_conversations(300, 0, "heldout")
    assert not any(p.format(city="") in c.turns[0] for p in held_personas for c in train if c.category == "roleplay")
    firsts = {c.turns[0] for c in train}
    clean = chat_heldout_conversations(300, 0, firsts)
    assert len(clean) == 300 and not {c.turns[0] for c in clean} & firsts
    assert sum(c.turns[0] in firsts for c in held) <= 0.05 * len(held)  # the filter drops only a few
    with pytest.raises(ValueError, match="split must be one of"):
        Pools("test")


def test_no_training_prompt_overlaps_an_evaluation_prompt():
    sets = evaluation_prompts("data")
    assert {"mt_bench", "spec_bench", "cnn_dm", "spider", "humaneval", "bench"} <= set(sets)
    convs = chat_conversations(3000, 0) + chat_conversations(500, 0, "heldout")
    assert contaminated([t for c in convs for t in c.turns]) == []
    assert contaminated(build_prompts(2000, 0)) == []


def test_evaluation_prompts_are_refused_whole_or_in_part():
    mt = json.loads(open("data/mt_bench/question.jsonl").readline())["turns"][0]
    with pytest.raises(ValueError, match="overlap evaluation prompts.*mt_bench"):
        refuse_evaluation_prompts(["Explain photosynthesis.", mt])
    # a 13-word window of a CNN/DailyMail article inside a longer prompt
    article = evaluation_prompts("data")["cnn_dm"][0].split()
    with pytest.raises(ValueError, match="cnn_dm|spec_bench"):  # Spec-Bench ships the same articles
        refuse_evaluation_prompts(["Summarize this: " + " ".join(article[40:60]) + " Thanks!"])
    spider_q = evaluation_prompts("data")["spider"][0]
    assert contaminated([spider_q.upper()])[0][1] == "spider"  # case and punctuation do not hide it
    refuse_evaluation_prompts(["Write a haiku about tea."])  # nothing shared: no error


def tiny_chat_target(tok):
    return tiny_llama(
        0,
        vocab=len(tok),
        hidden=32,
        layers=1,
        heads=2,
        kv_heads=1,
        eos=tok.eos_token_id,
        tie_word_embeddings=True,
        scale=4.0,
    )


def test_second_turns_follow_the_targets_own_first_answer():
    tok = word_tokenizer()
    cached = CachedModel(tiny_chat_target(tok))
    convs = [Conversation("qa", ("write a function", "print the list")), Conversation("qa", ("return x",))]
    g = torch.Generator().manual_seed(0)
    recs = sample_conversations(
        tok,
        convs,
        lambda ids: sample_answers_packed(
            cached,
            ids,
            max_new_tokens=6,
            top_k_store=4,
            sample_top_k=20,
            sample_top_p=0.95,
            eos_id=tok.eos_token_id,
            gen=g,
        ),
    )
    assert [r.kind for r in recs] == ["gen", "gen", "gen2"]
    first, second = recs[0], recs[2]
    answer = tok.decode(
        [t for t in first.ids[first.start :].tolist() if t != tok.eos_token_id], skip_special_tokens=True
    )
    messages = [
        {"role": "user", "content": "write a function"},
        {"role": "assistant", "content": answer},
        {"role": "user", "content": "print the list"},
    ]
    assert second.ids[: second.start].tolist() == encode_prompt(
        tok, messages, chat=True
    )  # as a chat front end sends it
    assert second.ids[: first.start].tolist() == first.ids[: first.start].tolist()  # the same conversation opening
    assert len(second.topk_ids) == len(second.ids) - second.start


def test_chat_teacher_data_is_written_in_shards_and_checked_first(tmp_path, monkeypatch):
    tok = word_tokenizer()
    target = tiny_chat_target(tok)
    kw = small_chat_run(time_budget_s=1e9, engine="packed", slots=8)
    generate_teacher_data(target, tok, tmp_path / "a", **kw)
    recs = load_records(tmp_path / "a")
    assert len(list((tmp_path / "a").glob("shard-*.pt"))) == 3
    convs = chat_conversations(12, 0)
    assert Counter(r["kind"] for r in recs) == {"gen": 12, "gen2": sum(len(c.turns) == 2 for c in convs)}
    again = tmp_path / "b"
    generate_teacher_data(target, tok, again, **kw)
    assert all(torch.equal(a["ids"], b["ids"]) for a, b in zip(recs, load_records(again)))  # deterministic
    with pytest.raises(ValueError, match="instructions or chat"):
        generate_teacher_data(target, tok, tmp_path / "c", **{**kw, "prompts": "web"})
    mt = json.loads(open("data/mt_bench/question.jsonl").readline())["turns"]
    leaked = [Conversation("writing", tuple(mt))]
    monkeypatch.setattr(teacher_data, "chat_conversations", lambda n, seed, split, multi: leaked * n)
    with pytest.raises(ValueError, match="evaluation sets are never trained on"):
        generate_teacher_data(target, tok, tmp_path / "d", **kw)
    assert not (tmp_path / "d").exists() or not list((tmp_path / "d").glob("shard-*"))


def test_chat_heldout_rows_cover_every_turn():
    tok = word_tokenizer()
    target = tiny_chat_target(tok)
    convs = [Conversation("qa", ("write a function", "print the list")), Conversation("qa", ("return x",))]
    held = build_heldout(target, tok, convs, max_new_tokens=5, seed=3, engine="batched")
    assert held["prompts"] == [["write a function", "print the list"], ["return x"]]
    assert len(held["rows"]) == 3
    for row in held["rows"]:
        n = len(row["ids"]) - row["start"]
        assert row["p"].shape == (n, 10) and torch.allclose(row["p"].sum(-1), torch.ones(n), atol=1e-5)
    again = build_heldout(target, tok, convs, max_new_tokens=5, seed=3, engine="batched")
    assert all(torch.equal(a["ids"], b["ids"]) for a, b in zip(held["rows"], again["rows"]))
