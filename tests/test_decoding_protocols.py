"""The contract between a method and the loop (pipeline/decoding/contract.py): one declared ``loop`` chooses the
protocol the loop takes a method through, one ``Capabilities`` per validated ``Args``, the drafter's declared parts
(``beams``, ``admits``, ``max_depth``) in place of kind strings, and one check of a request."""

from __future__ import annotations

import pickle
import re

import pytest
import torch

from helpers.exact import PROMPT, WARP
from helpers.models import tiny_llama
from helpers.paths import REPO
from pipeline.decoding import METHODS, build_decoder, check_method, make_generator, method_class
from pipeline.decoding.ar import AutoregressiveDecoder
from pipeline.decoding.base import validate_params
from pipeline.decoding.batched import BatchedDecoder
from pipeline.decoding.contract import LOOPS, Capabilities
from pipeline.decoding.drafters import Drafter, ModelDrafter

DECODING = REPO / "pipeline" / "decoding"


@pytest.fixture(scope="module")
def pair():
    return tiny_llama(0, vocab=32, layers=2), tiny_llama(1, vocab=32, layers=1)


def test_every_method_declares_a_loop_and_the_loop_takes_it_through_that_protocol(pair):
    """Each registered method's configured loop is one of LOOPS, and the loop builds over it at batch 1 (a loop
    whose protocol the method does not meet would be refused here)."""
    target, draft = pair
    for name in METHODS.names():
        if name == "medusa":  # needs its heads (tests/test_decoding_tree_methods.py builds it)
            continue
        decoder = build_decoder(name, target, draft, **WARP)
        caps = decoder.capabilities
        assert caps.loop in LOOPS and caps.loop == type(decoder).loop, name
        engine = BatchedDecoder(decoder, 1)
        assert engine.own_loop == (caps.loop == "own"), name
        assert (engine.chain is not None, engine.trees is not None, engine.drawer is not None) == (
            caps.loop == "chain",
            caps.loop == "tree",
            caps.loop == "draw",
        ), name


def test_a_method_that_declares_a_loop_it_does_not_implement_is_refused_with_the_part_named(pair):
    class Undrawn(AutoregressiveDecoder):
        loop = "draw"  # but no draw_tokens

    decoder = Undrawn(pair[0], **WARP)
    with pytest.raises(TypeError, match=r"declares loop 'draw' but lacks draw_tokens of DrawMethod"):
        BatchedDecoder(decoder, 1)


def test_an_undeclared_loop_is_refused_when_the_class_is_defined():
    with pytest.raises(TypeError, match=r"loop must be one of"):

        class Sideways(AutoregressiveDecoder):
            loop = "sideways"


def test_capabilities_are_computed_once_with_the_args_and_carried_by_the_decoder(pair):
    cls = method_class("typical")
    args = validate_params(cls, {"tree": True}, has_draft=True)
    caps = args.capabilities
    assert caps is args.capabilities  # once per Args
    assert isinstance(caps, Capabilities) and (caps.loop, caps.draft_shape, caps.draft_depth) == ("tree", "tree", 3)
    assert caps.walk is cls.walk
    decoder = cls(pair[0], pair[1], args=args)
    assert decoder.capabilities is caps and decoder.shape == "tree"
    again = pickle.loads(pickle.dumps(args))  # the cell's Args travel pickled: the fields alone, capabilities again
    assert again == args and "capabilities" not in vars(again) and again.capabilities == caps


def test_medusa_and_spectr_and_bild_capabilities_follow_their_parameters():
    medusa = method_class("medusa")
    exact = medusa.capabilities_of(check_method("medusa", {"acceptance": "exact"}))
    typical = medusa.capabilities_of(check_method("medusa", {}))
    assert exact.lossless and not typical.lossless and exact.walk is not typical.walk
    assert exact.drafter == "medusa" and exact.batchable
    spectr = method_class("spectr").capabilities_of(check_method("spectr", {"gamma": 5, "num_drafts": 2}))
    assert (spectr.loop, spectr.draft_depth) == ("tree", 5)
    bild = method_class("bild").capabilities_of(check_method("bild", {"max_small_steps": 7}))
    assert (bild.loop, bild.draft_depth) == ("chain", 7)


def test_bild_takes_a_drafter_by_its_declared_admits_not_its_kind():
    bild = method_class("bild")
    values = check_method("bild", {})
    admitting = type("Admitting", (Drafter,), {"kind": "admitting", "admits": True})
    assert bild.accepts(admitting, values) is None
    assert "needs the draft model" in bild.accepts(type("Plain", (Drafter,), {"kind": "plain"}), values)


def test_mtad_asks_beams_only_of_a_drafter_that_declares_them(pair, monkeypatch):
    decoder = build_decoder("mtad", *pair, **WARP, gamma=2)
    decoder.start(list(PROMPT))
    asked = []
    real = ModelDrafter.propose_beams

    def spy(self, *a, **k):
        asked.append(self)
        return real(self, *a, **k)

    monkeypatch.setattr(ModelDrafter, "propose_beams", spy)
    assert decoder.propose(list(PROMPT), 2, make_generator(0)) is not None and len(asked) == 1
    monkeypatch.setattr(ModelDrafter, "beams", False)
    decoder.start(list(PROMPT))
    tokens, log_q = decoder.propose(list(PROMPT), 2, make_generator(0))
    assert len(asked) == 1 and tokens.shape == log_q.shape  # the chain, its log q at its tokens


def test_a_tree_is_as_deep_as_its_drafter_can_draft(pair, monkeypatch):
    """``Drafter.max_depth`` (declared on the base: None, as deep as asked) caps the levels the loop asks for."""
    assert build_decoder("specinfer", *pair, **WARP, k_config=[2, 2, 2, 2]).draft_depth == 4
    monkeypatch.setattr(ModelDrafter, "max_depth", property(lambda self: 2))
    decoder = build_decoder("specinfer", *pair, **WARP, k_config=[2, 2, 2, 2])
    assert decoder.capabilities.draft_depth == 4 and decoder.draft_depth == 2
    got = BatchedDecoder(decoder, 1).generate([PROMPT], max_new_tokens=8, generators=[make_generator(1)])[0]
    assert got.drafted and max(got.drafted) <= 2


@pytest.mark.parametrize("method", ["ar", "beam"])
def test_one_check_of_a_request_for_every_loop(pair, method):
    """The one request check (``base.check_request``) refuses what it refuses for a method the loop runs and for one
    with a loop of its own alike (before: beam's generate took ``max_new_tokens=True`` as 1)."""
    decoder = build_decoder(method, pair[0], **WARP)
    for bad, why in ((True, "max_new_tokens must be an integer >= 1"), (0, "max_new_tokens must be an integer")):
        with pytest.raises(ValueError, match=why):
            decoder.generate(PROMPT, max_new_tokens=bad)
    with pytest.raises(ValueError, match="input_ids is empty"):
        decoder.generate([], max_new_tokens=2)
    with pytest.raises(ValueError, match="exceeds the target's context"):
        decoder.generate(PROMPT, max_new_tokens=10**9)


def test_the_cached_models_logits_are_public(pair):
    decoder = build_decoder("ar", pair[0], **WARP)
    target = decoder.target
    raw = torch.randn(2, 32)
    wide, narrow = target.logits(torch.randn(2, target.vocab_size + 3)), target.logits(raw[:, :4])
    assert wide.shape[-1] == narrow.shape[-1] == target.vocab_size  # model rows cut or padded to the vocabulary
    assert torch.isinf(narrow[:, 4:]).all() and not hasattr(target, "_logits")  # the former private name is gone


def test_the_loop_probes_no_capability_and_the_engine_silences_no_type_check():
    batched = (DECODING / "batched.py").read_text()
    assert "getattr(" not in batched and "hasattr(" not in batched
    ignored = [p.name for p in DECODING.glob("*.py") if "type: ignore" in p.read_text()]
    assert not ignored, f"type: ignore in {ignored}"
    hooks = "shape_of|shape_for|depth_of|lossless_of|drafter_of|walk_for|batch_refusal|draft_length\\(self"
    retired = re.compile(rf"def ({hooks})\b")
    defined = [str(p.relative_to(REPO)) for p in (REPO / "pipeline").rglob("*.py") if retired.search(p.read_text())]
    assert not defined, f"retired capability hooks defined again in {defined}: override capabilities_of"
