"""Adding a dataset (one YAML, a loader, a scorer) or a chain rule and a drafter (one file each, named as
``module:attr``) from a folder of one's own, touching no file of the repository (docs/extending.md).

The dataset ``word_count`` below lives only in a temporary folder: its task spec in
``<tmp>/myconf/dataset/word_count.yaml`` (found through ``conf_path=[<tmp>/myconf]``, Hydra's search path), its loader
``wc_loader.py`` and its scorer ``wc_scorer.py`` beside it (on ``sys.path``). No file of the
repository is written: the planner, the cell and the driver run it through its task spec, its
scorer's preflight runs before the models, and its verdict field reaches each generation's record in
MLflow. The files written here are the ones docs/extending.md shows.
"""

from __future__ import annotations

import importlib
import json
import subprocess
from pathlib import Path

import pytest

from helpers.models import tiny_llama
from helpers.project import REPO, make_project, overrides
from pipeline import sweep
from pipeline.cell import run_cell
from pipeline.cell_types import STATUS_FINISHED
from pipeline.decoding import build_decoder, check_method, make_generator
from pipeline.sweep import driver
from pipeline.tracking import Tracker

TASK_YAML = """\
# Word count: answer in as many words as asked (a toy task of docs/extending.md).
name: word_count
path: {data}                 # a JSON-lines file: {{"id", "question", "words"}}
split: null
start: 0
limit: 2
ids: null
max_new_tokens: 8
max_turns: null
time_budget_s: null
options: {{}}
task:
  version: 1
  loader: wc_loader          # load(path, **options) and continuation(sample, turn, answers)
  stop_strings: ["\\n\\n"]
  scorer:
    name: "wc_scorer:SCORER"  # a Scorer outside pipeline/scoring
    params: {{tolerance: 100}}
    fields: [words, ok]
"""

LOADER = '''\
"""Word count: questions asking for an answer of a given length."""

import json
from pathlib import Path

from pipeline.data.base import Sample, default_continuation

NAME = "word_count"


def load(path, split=None):
    rows = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    return [Sample(id=str(r["id"]), dataset=NAME, turns=[r["question"]], reference=r["words"]) for r in rows]


def continuation(sample, turn, answers):
    return default_continuation(sample, turn, answers)
'''

SCORER = '''\
"""How many answers have the asked number of words (within ``tolerance``)."""

from pipeline.scoring import prediction_text
from pipeline.scoring.registry import Scorer

PREFLIGHTS = []


def score(dataset, samples, predictions, *, judge=None, max_turns=None, tolerance=0):
    asked = {s.id: s.reference for s in samples}
    details = []
    for p in predictions:
        words = len(prediction_text(p).split())
        details.append({"id": p["id"], "words": words, "ok": abs(words - asked[p["id"]]) <= tolerance})
    return {"metric": "word_count_ok", "score": sum(d["ok"] for d in details) / len(details), "details": details}


SCORER = Scorer("word_count", score, fields=("words", "ok"), preflight=PREFLIGHTS.append)
'''


@pytest.fixture(scope="module")
def own_folder(tmp_path_factory) -> Path:
    """The user's folder: the task YAML, the loader, the scorer and the data; nothing in the repository."""
    folder = tmp_path_factory.mktemp("my_dataset")
    data = folder / "word_count.jsonl"
    data.write_text(
        "".join(json.dumps({"id": i, "question": f"say {n} words", "words": n}) + "\n" for i, n in enumerate((3, 5, 7)))
    )
    (folder / "myconf" / "dataset").mkdir(parents=True)
    (folder / "myconf" / "dataset" / "word_count.yaml").write_text(TASK_YAML.format(data=data))
    (folder / "wc_loader.py").write_text(LOADER)
    (folder / "wc_scorer.py").write_text(SCORER)
    return folder


def _repo_status() -> str:
    return subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=all", "--", "pipeline", "conf"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout


def test_a_dataset_from_a_folder_of_ones_own_runs_through_plan_cell_driver_and_mlflow(
    own_folder, tmp_path, monkeypatch
):
    before = _repo_status()
    monkeypatch.syspath_prepend(str(own_folder))
    root = make_project(tmp_path)
    args = [
        *overrides(root, "sweep.methods=[ar]", "sweep.baseline=null", "sweep.datasets=[word_count]"),
        f"conf_path=[{own_folder / 'myconf'}]",
    ]
    plan = sweep.expand(sweep.compose(args, root / "conf"), root)

    (cell,) = plan.cells
    assert cell.dataset_name == "word_count" and plan.sample_counts == {"word_count[0:2]": 2}
    assert cell.dataset["task"]["scorer"] == "wc_scorer:SCORER" and cell.dataset["task"]["score_fields"] == [
        "words",
        "ok",
    ]
    driver.preflight(plan.cells)  # the scorer's own preflight, before any model loads
    assert importlib.import_module("wc_scorer").PREFLIGHTS == [
        None
    ]  # called once, with the cell's judge (none: the scorer uses no judge)

    result = run_cell(cell)
    assert result.status == STATUS_FINISHED, result.traceback
    assert result.score_metric == "word_count_ok" and 0.0 <= result.metrics["score"] <= 1.0
    assert [set(r["score_detail"]) for r in result.records] == [{"words", "ok"}] * 2  # the task's fields only

    tracker = Tracker(f"sqlite:///{root}/mlflow.db", "word_count", str(root / "mlruns"))
    try:
        run_id = tracker.log_cell(cell, result)
        assert [r["score_detail"]["words"] for r in tracker.samples(run_id)] == [
            d["words"] for d in result.scores["details"]
        ]
        assert tracker.client.get_run(run_id).data.params["dataset.task.loader"] == "wc_loader"
    finally:
        tracker.close()
    assert _repo_status() == before  # no file of the repository's pipeline/ or conf/ was written


def test_a_task_spec_that_cannot_work_is_refused_when_the_sweep_is_planned(own_folder, tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(own_folder))
    root = make_project(tmp_path)
    broken = own_folder / "broken" / "dataset"
    broken.mkdir(parents=True)
    text = TASK_YAML.format(data=own_folder / "word_count.jsonl").replace("name: word_count", "name: word_count_broken")
    (broken / "word_count_broken.yaml").write_text(
        text.replace("fields: [words, ok]", "fields: [words, verdict]").replace(
            "loader: wc_loader", "loader: wc_loaderr"
        )
    )
    args = [
        *overrides(root, "sweep.methods=[ar]", "sweep.baseline=null", "sweep.datasets=[word_count_broken]"),
        f"conf_path=[{own_folder / 'broken'}]",
    ]
    with pytest.raises(sweep.SweepConfigError, match=r"loader module 'wc_loaderr' cannot be imported"):
        sweep.expand(sweep.compose(args, root / "conf"), root)
    (broken / "word_count_broken.yaml").write_text(text.replace("fields: [words, ok]", "fields: [words, verdict]"))
    with pytest.raises(
        sweep.SweepConfigError, match=r"score field\(s\) \['verdict'\] are not written by scorer 'word_count'"
    ):
        sweep.expand(sweep.compose(args, root / "conf"), root)


RULE = '''\
"""Token verification of at most `cap` drafts: a shorter chain is still a chain, so it stays lossless."""

from pipeline.decoding import ChainRule
from pipeline.decoding.base import Param, int_at_least
from pipeline.decoding.speculative import DraftVerifyDecoder
from pipeline.decoding.verification import token_verify


def capped_token_rule(P, Q, x, u, *, cap):
    m = min(cap, x.shape[0])
    return token_verify(P[: m + 1], Q[:m], x[:m], u[:m])


class CappedToken(DraftVerifyDecoder):
    name = "capped"
    lossless = True
    rule = ChainRule(capped_token_rule, params=("cap",))
    params = {**DraftVerifyDecoder.params, "cap": Param(2, int_at_least(1), "drafts verified at most")}
'''

DRAFTER = '''\
"""Echo: the tokens that followed the latest earlier occurrence of the last token."""

import torch

from pipeline.decoding.base import Param, int_at_least
from pipeline.decoding.drafters import Drafter
from pipeline.decoding.drafting import ChainDraft


class Echo(Drafter):
    kind = "echo"
    params = {"span": Param(2, int_at_least(1), "tokens proposed at most")}

    def __init__(self, vocab, device, span):
        self.vocab, self.device, self.span = vocab, device, span

    @classmethod
    def create(cls, decoder, scope):
        return cls(decoder.target.vocab_size, decoder.target.device, scope["span"])

    def start(self, prompt, hidden=None):
        pass

    def propose(self, context, gamma, warper, generator):
        last = context[-1]
        for i in range(len(context) - 2, -1, -1):
            if context[i] == last:
                x = torch.tensor(context[i + 1 : i + 1 + min(gamma, self.span)], device=self.device)
                return ChainDraft(x, torch.nn.functional.one_hot(x, self.vocab).float())
        return None
'''

METHOD_YAML = """\
name: "my_rules:CappedToken"
drafter: {kind: "my_drafts:Echo", span: 2}
"""


@pytest.fixture(scope="module")
def rule_folder(tmp_path_factory) -> Path:
    """The user's folder for a rule and a drafter: the two modules and a method YAML; nothing in the repository."""
    folder = tmp_path_factory.mktemp("my_rules")
    (folder / "my_rules.py").write_text(RULE)
    (folder / "my_drafts.py").write_text(DRAFTER)
    (folder / "myconf" / "method").mkdir(parents=True)
    (folder / "myconf" / "method" / "capped.yaml").write_text(METHOD_YAML)
    return folder


def test_a_chain_rule_and_a_drafter_of_ones_own_run_by_module_attr(rule_folder, tmp_path, monkeypatch):
    before = _repo_status()
    monkeypatch.syspath_prepend(str(rule_folder))
    values = check_method("my_rules:CappedToken", {"drafter": {"kind": "my_drafts:Echo"}})
    assert values["drafter"] == {"kind": "my_drafts:Echo", "span": 2} and values["cap"] == 2  # declared defaults
    with pytest.raises(ValueError, match=r"parameter cap=0 must be an integer >= 1"):
        check_method("my_rules:CappedToken", {"cap": 0})

    # greedy identity with ar, through the chain loop and the user's rule and drafter
    target = tiny_llama(10, vocab=64, hidden=32, layers=2)
    ar = build_decoder("ar", target, temperature=0)
    mine = build_decoder(
        "my_rules:CappedToken", target, None, temperature=0, gamma=4, drafter={"kind": "my_drafts:Echo", "span": 3}
    )
    prompt = [5, 9, 2, 5, 9, 2, 5]
    gen = mine.generate(prompt, max_new_tokens=24)
    assert gen.tokens == ar.generate(prompt, max_new_tokens=24).tokens
    assert max(gen.drafted) >= 1  # the drafter proposed and the rule verified
    sampled = build_decoder("my_rules:CappedToken", target, None, drafter="my_drafts:Echo")
    assert len(sampled.generate(prompt, max_new_tokens=16, generator=make_generator(0)).tokens) == 16

    # a sweep names it through a YAML in the user's folder: planned, run and keyed like any method
    root = make_project(tmp_path)
    args = [
        *overrides(root, "sweep.methods=[capped]", "sweep.baseline=null", "sweep.datasets=[tiny_mt]"),
        f"conf_path=[{rule_folder / 'myconf'}]",
    ]
    plan = sweep.expand(sweep.compose(args, root / "conf"), root)
    (cell,) = plan.cells
    assert cell.method == "my_rules:CappedToken" and cell.params["drafter"] == {"kind": "my_drafts:Echo", "span": 2}
    result = run_cell(cell)
    assert result.status == STATUS_FINISHED, result.traceback
    assert _repo_status() == before  # no file of the repository's pipeline/ or conf/ was written


@pytest.mark.parametrize("raising", ["raise RuntimeError('boom at import')", "1 / 0", "raise SystemExit(3)"])
def test_a_module_attr_whose_module_raises_at_import_is_refused_naming_it(tmp_path, monkeypatch, raising):
    """A method or drafter named ``module:attr`` whose module raises at import: the planner's usual refusal naming
    the entry and the module (a SweepConfigError: exit 2, no traceback), never ``conf/method/<module:attr>.yaml``."""
    name = f"broken_{abs(hash(raising))}"
    (tmp_path / f"{name}.py").write_text(raising + "\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ValueError, match=rf"importing module '{name}' raised"):
        check_method(f"{name}:Rule", {})
    with pytest.raises(ValueError, match=rf"drafter '{name}:Echo'.*importing module '{name}' raised"):
        check_method("spd", {"drafter": {"kind": f"{name}:Echo"}})
    root = make_project(tmp_path / "project")
    for entry in (f"{name}:Rule", f"{{method: spd, drafter: {{kind: '{name}:Echo'}}}}"):
        with pytest.raises(sweep.SweepConfigError) as err:
            sweep.expand(
                sweep.compose(overrides(root, f"sweep.methods=[{entry}]", "sweep.baseline=null"), root / "conf"), root
            )
        assert f"importing module '{name}' raised" in str(err.value)
        assert f"conf/method/{name}:" not in str(err.value)
