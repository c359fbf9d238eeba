"""Configuration errors name the valid keys; method defaults are written once (code and YAML agree)."""

from __future__ import annotations

import http.server
import re
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from helpers.paths import CONF, REPO
from pipeline import sweep
from pipeline.data import task_names, task_spec
from pipeline.data.tasks import TaskSpec, TaskSpecError
from pipeline.decoding import METHODS, method_class
from pipeline.models import PairSpec, pair_config
from pipeline.scoring.registry import SCORERS, check_task_scorer, scorer_for
from pipeline.sweep import driver
from pipeline.sweep.plan import check_command_line
from pipeline.tracking import TrackingError


@pytest.mark.parametrize("method", sorted(METHODS))
def test_method_yaml_lists_every_parameter_with_the_code_default(method):
    path = CONF / "method" / f"{method}.yaml"
    assert path.exists(), f"registered method {method!r} has no conf/method/{method}.yaml"
    written = yaml.safe_load(path.read_text())
    assert written.pop("name") == method
    defaults = {k: p.default for k, p in method_class(method).all_params().items()}
    assert written == defaults, f"conf/method/{method}.yaml and {method_class(method).__name__}'s Param defaults differ"


def test_every_method_yaml_names_a_registered_method():
    for path in CONF.glob("method/*.yaml"):
        assert yaml.safe_load(path.read_text())["name"] in METHODS, path


def test_a_misspelt_pair_key_is_refused_with_the_valid_keys():
    cfg = pair_config("smollm2-offline")
    cfg["meduza"] = cfg.pop("medusa")
    with pytest.raises(ValueError, match=r"unknown pair config key\(s\) \['meduza'\]; valid keys: .*'medusa'"):
        PairSpec.from_config(cfg)
    PairSpec.from_config(pair_config("smollm2-offline"))  # the shipped one is fine


@pytest.mark.parametrize(
    "override, message",
    [
        ("+sweep.method=spd", r"unknown key\(s\) \['method'\] under `sweep:`; valid keys: \['name', 'methods'"),
        ("+measure.warmup_secs=1", r"unknown key\(s\) \['warmup_secs'\] in `measure:`.*'warmup_seconds'"),
        ("+judge.modle=x", r"unknown key\(s\) \['modle'\] in `judge:`.*'model'"),
        ("+cluster.max_in_fligt=2", r"unknown key\(s\) \['max_in_fligt'\] in `cluster:`.*'max_in_flight'"),
        ("+pair.meduza=models/x", r"unknown pair config key\(s\) \['meduza'\]"),
        ("+dataset.limt=2", r"dataset 'humaneval': unknown key\(s\) \['limt'\].*'limit'"),
    ],
)
def test_unknown_keys_in_any_group_are_refused_before_ray(override, message, tmp_path):
    overrides = ["sweep=all_methods", "pair=smollm2-offline", "dataset=humaneval", "method=spd", override]
    with pytest.raises(sweep.SweepConfigError, match=message):
        sweep.expand(sweep.compose(overrides), tmp_path)


def test_every_task_names_a_registered_scorer_or_none_and_only_fields_it_writes():
    tasks = [task_spec(name) for name in task_names()]
    named = {t.scorer for t in tasks}
    assert named - {None} <= set(SCORERS)
    assert {"humaneval", "spider", "rouge", "mt_bench"} <= named
    for task in tasks:
        assert check_task_scorer(task) is scorer_for(task.scorer)
        assert set(task.score_fields) <= set(getattr(scorer_for(task.scorer), "fields", ()))
    with pytest.raises(ValueError, match="registered scorers"):
        scorer_for("bleu")
    with pytest.raises(ValueError, match=r"score field\(s\) \['verdict'\] are not written by scorer 'spider'"):
        check_task_scorer(replace(task_spec("spider"), score_fields=("correct", "verdict")))


# ----------------------------------------------------------------------------- before Ray, exit 2 (issue 25)


def _refused_before_ray(monkeypatch, tmp_path, overrides, error=sweep.SweepConfigError):
    def no_ray(cluster):
        raise AssertionError("Ray was started before the configuration was checked")

    monkeypatch.setattr(driver, "start_ray", no_ray)
    cfg = sweep.compose(["sweep=smoke", f"tracking.uri=sqlite:///{tmp_path}/mlflow.db", "progress=false", *overrides])
    with pytest.raises(error) as failure:
        sweep.run(cfg, root=REPO)
    return str(failure.value)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            ["pair=smollm2-offline", "pair.device=cuda:7"],
            r"device 'cuda:7' but (this machine has no CUDA GPU|a cell sees 1 GPU).*pair.device=auto",
        ),
        (["pair=smollm2-offline", "pair.device=gpu"], r"device 'gpu' is not a torch device"),
        (["measure.threads=0"], r"measure.threads=0: must be null or an integer >= 1"),
        (["measure.threads=-2"], r"measure.threads=-2: must be null or an integer >= 1"),
        (["measure.warmup_seconds=-1"], r"measure.warmup_seconds=-1: must be a finite number >= 0"),
        (
            ["measure.energy_meter=nvml+smi"],
            r"measure.energy_meter: unknown energy meter 'nvml\+smi'; valid: auto, nvml, rapl, zeus, none",
        ),
        (
            ["dataset=humaneval", "dataset.max_new_tokens=9000"],
            r"max_new_tokens=9000 does not fit the context of pair 'smollm2-offline'.*8192 positions",
        ),
        (
            ["pair=smollm2-offline", "pair.draft.id=/nonexistent/draft-model"],
            r"draft model folder '/nonexistent/draft-model' does not exist",
        ),
        (
            ["pair=smollm2-offline", "pair.draft.id=models/no-such-draft"],
            r"draft model folder 'models/no-such-draft' does not exist",
        ),
    ],
)
def test_inputs_that_would_fail_every_cell_are_refused_before_ray(monkeypatch, tmp_path, overrides, message):
    assert re.search(message, _refused_before_ray(monkeypatch, tmp_path, overrides))


# issue 36 item 7: numbers that passed the checks and then failed, hung or broke the store for good
@pytest.mark.parametrize(
    "overrides, message",
    [
        (["seeds=[99999999999999999999]"], r"seeds: 99999999999999999999 is out of range: .*\[0, 2\*\*63 - 1\]"),
        (["seeds=[-1]"], r"seeds: -1 is out of range"),
        (["measure.warmup_seconds=inf"], r"measure.warmup_seconds=inf: must be a finite number >= 0"),
        (["measure.idle_seconds=nan"], r"measure.idle_seconds=nan: must be a finite number >= 0"),
        (["measure.warmup_generations=nan"], r"measure.warmup_generations=nan: must be an integer >= 0"),
        (
            ["cluster.cell_timeout_s=-1"],
            r"cluster.cell_timeout_s=-1: must be null or a finite number > 0 \(null or 0: no limit\)",
        ),
        (["cluster.cell_timeout_s=nan"], r"cluster.cell_timeout_s=nan: must be null"),
        (["cluster.cpus_per_cell=-2"], r"cluster.cpus_per_cell=-2: must be null or a finite number > 0"),
        (["cluster.max_in_flight=0"], r"cluster.max_in_flight=0: must be null or an integer >= 1"),
        (
            ["judge.max_new_tokens=-1"],
            r"judge.max_new_tokens=-1: must be an integer >= 1 \(e.g. judge.max_new_tokens=256\)",
        ),
        (["+judge.max_retries=-3"], r"judge.max_retries=-3: must be null or an integer >= 0"),
        (
            ["method=spd", "method.temperature=inf"],
            r"method 'spd\(temperature=inf\)': method.temperature=inf: must be a finite number",
        ),
        (["method=spd", "method.top_p=nan"], r"method.top_p=nan: must be a finite number"),
        (["+sweep.method_overrides.top_p=nan"], r"method 'ar\(top_p=nan\)': method.top_p=nan: must be a finite number"),
        (
            ["pair=smollm2-offline", "pair.dtype=[1]"],
            r"pair 'smollm2-offline': unknown dtype \[1\]; choose one of .*pair.dtype=auto",
        ),
        (["pair=smollm2-offline", "pair.chat=[1]"], r"chat=\[1\]: must be true or false"),
        (
            ["pair=smollm2-offline", "~pair.target", "+pair.target=[1]"],
            r"a model spec must be a Hub id, a folder or a mapping",
        ),
        (
            ["dataset=humaneval", "dataset.time_budget_s=nan"],
            r"dataset 'humaneval': dataset.time_budget_s=nan: must be null or a finite number > 0",
        ),
        (["dataset=humaneval", "dataset.start=-1"], r"dataset.start=-1: must be null or an integer >= 0"),
        (
            ["dataset=humaneval", "dataset.limit=99999999999999999999"],
            r"dataset.limit=99999999999999999999: out of range \(integers must fit in 64 bits",
        ),
        (["+fault_injection.seconds=inf"], r"fault_injection.seconds=inf: must be a finite number"),
    ],
)
def test_numbers_out_of_range_or_not_finite_are_refused_before_ray(monkeypatch, tmp_path, overrides, message):
    text = _refused_before_ray(monkeypatch, tmp_path, overrides)
    assert re.search(message, text), text
    if (
        not overrides[0].lstrip("+").startswith(("method", "sweep.method"))
    ):  # (a method's own check may add its range besides)
        assert text.count("\n  - ") <= 1, text  # one error per bad setting, not the generic walk's besides the range's


def test_the_sweep_command_exits_2_on_a_seed_beyond_int64(tmp_path):
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "pipeline.sweep",
            "seeds=[99999999999999999999]",
            f"tracking.uri=sqlite:///{tmp_path}/m.db",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    assert "seeds: 99999999999999999999 is out of range" in out.stderr and not (tmp_path / "m.db").exists()


@pytest.mark.parametrize("uri", ["sqlite:///:memory:", "sqlite://", "sqlite:///file::memory:?cache=shared"])
def test_an_in_memory_store_is_refused_and_writes_no_file(monkeypatch, tmp_path, uri):
    monkeypatch.chdir(tmp_path)
    before = set(REPO.iterdir())
    monkeypatch.setattr(driver, "start_ray", lambda cluster: (_ for _ in ()).throw(AssertionError("Ray started")))
    cfg = sweep.compose(["sweep=smoke", f"tracking.uri='{uri}'", "progress=false"])
    with pytest.raises(TrackingError, match=r"in-memory sqlite store .*tracking.uri=sqlite:///mlflow.db"):
        sweep.run(cfg, root=REPO)
    assert set(REPO.iterdir()) == before and not list(tmp_path.iterdir())  # no file named ':memory:' anywhere


def test_conf_path_folders_that_do_not_exist_or_shadow_a_builtin_are_refused(tmp_path):
    missing = tmp_path / "no-such-folder"
    with pytest.raises(sweep.SweepConfigError, match=rf"conf_path folder '{missing}' does not exist"):
        sweep.expand(sweep.compose(["sweep=smoke", f"conf_path=[{missing}]"]), tmp_path)
    own = tmp_path / "myconf"
    (own / "method").mkdir(parents=True)
    (own / "method" / "spd.yaml").write_text("name: spd\ngamma: 9\n")  # would be ignored: conf/method/spd.yaml wins
    with pytest.raises(
        sweep.SweepConfigError,
        match=r"myconf/method/spd.yaml reuses the name method=spd of .*conf/method/spd.yaml.*rename",
    ):
        sweep.expand(sweep.compose(["sweep=smoke", f"conf_path=[{own}]"]), tmp_path)
    other = tmp_path / "other"
    (other / "method").mkdir(parents=True)
    (other / "method" / "spd9.yaml").write_text("name: spd\ngamma: 9\n")
    (own / "method" / "spd.yaml").rename(own / "method" / "spd9.yaml")
    with pytest.raises(
        sweep.SweepConfigError, match=r"other/method/spd9.yaml reuses the name method=spd9 of .*myconf/method/spd9.yaml"
    ):
        sweep.expand(sweep.compose(["sweep=smoke", f"conf_path=[{own},{other}]"]), tmp_path)


def test_a_relative_module_name_is_a_clear_error_not_a_type_error():
    with pytest.raises(
        ValueError, match=r"scorer '.mine:SCORER': a relative module cannot be imported by the Ray workers"
    ):
        scorer_for(".mine:SCORER")
    with pytest.raises(ValueError, match=r"scorer ':SCORER': name `module:attr`"):
        scorer_for(":SCORER")
    with pytest.raises(TaskSpecError, match=r"loader module '.humaneval' is not an absolute module name"):
        TaskSpec.from_config("humaneval", {"loader": ".humaneval", "prompt": "pipeline.data.humaneval"})


def test_a_store_at_a_new_top_level_folder_is_refused_before_ray(monkeypatch, tmp_path):
    assert not Path("/file").exists()
    message = _refused_before_ray(monkeypatch, tmp_path, ["tracking.uri=sqlite:////file/x.db"], TrackingError)
    assert "top-level folder /file" in message and "sqlite:///file/x.db" in message
    assert not Path("/file").exists()


def test_a_store_path_under_a_file_is_refused_before_ray(monkeypatch, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    message = _refused_before_ray(monkeypatch, tmp_path, [f"tracking.uri=sqlite:///{blocker}/x.db"], TrackingError)
    assert f"{blocker} is a file" in message and "tracking.uri=" in message


class _HealthOnly(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 - http.server's name
        self.send_response(200 if self.path == "/health" else 500)
        self.end_headers()
        self.wfile.write(b"OK" if self.path == "/health" else b"internal error")

    def log_message(self, *args):
        pass


def test_a_tracking_server_whose_api_fails_is_refused_in_seconds(monkeypatch, tmp_path):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _HealthOnly)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        start = time.monotonic()
        cfg = sweep.compose(["sweep=smoke", f"tracking.uri=http://127.0.0.1:{server.server_port}", "progress=false"])
        monkeypatch.setattr(driver, "start_ray", lambda cluster: (_ for _ in ()).throw(AssertionError("Ray started")))
        with pytest.raises(TrackingError, match="answers /health but its API fails \\(HTTP 500"):
            sweep.run(cfg, root=REPO)
        assert time.monotonic() - start < 60  # MLflow's own client retried for 270 s
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize(
    "content, message",
    [
        ("name: broken\ntarget: {id: x\n", r"conf/pair/broken.yaml is not valid YAML at line \d+"),
        ("- name: broken\n- target: x\n", r"is a YAML list, not a mapping"),
    ],
)
def test_a_broken_pair_file_is_a_config_error(tmp_path, content, message):
    conf = tmp_path / "conf"
    shutil.copytree(CONF, conf)
    (conf / "pair" / "broken.yaml").write_text(content)
    with pytest.raises(sweep.SweepConfigError, match=message):
        check_command_line(["pair=broken"], conf)
    cfg = sweep.compose(["sweep=smoke", "sweep.pairs=[broken]"], conf)  # listed in a sweep rather than selected
    with pytest.raises(sweep.SweepConfigError, match=message):
        sweep.expand(cfg, tmp_path)


@pytest.mark.parametrize(
    "arg, message",
    [
        ("method=nosuch", "unknown method 'nosuch'"),
        ("pair=nosuch", "unknown pair 'nosuch'"),
        ("dataset=nosuch", "unknown dataset 'nosuch'"),
        ("sweep=nosuch", "unknown sweep 'nosuch'"),
        ("+cluster=nosuch", "unknown cluster 'nosuch'"),
    ],
)
def test_unknown_group_on_the_command_line_exits_2_with_the_valid_names(arg, message):
    with pytest.raises(sweep.SweepConfigError, match=message + r".*valid \w+s: \["):
        check_command_line([arg])
    with pytest.raises(sweep.SweepConfigError, match=message):
        sweep.compose([arg])


def test_the_sweep_command_exits_2_on_an_unknown_group(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "pipeline.sweep", "pair=nosuch", f"tracking.uri=sqlite:///{tmp_path}/m.db"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    assert out.stderr.startswith("error: unknown pair 'nosuch'") and "smollm2-offline" in out.stderr
