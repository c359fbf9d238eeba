"""Failure handling around the store: logging that dies halfway, stale runs, duplicates, the judge.

The MT-Bench judge runs against a real OpenAI-compatible HTTP server on loopback (``http.server``):
``/v1/models`` and ``/v1/chat/completions`` answering a "[[7]]" rating, or HTTP 500 when switched off.
One local Ray session is shared by the tests of this module; each test has its own project folder.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
from mlflow import MlflowClient
from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore
from mlflow.tracking._tracking_service.registry import TrackingStoreRegistry

from helpers.judge import JudgeServer
from helpers.paths import REPO
from helpers.project import make_project, run_sweep
from pipeline import sweep
from pipeline.sweep import SweepConfigError, driver
from pipeline.sweep.ray_runner import core_sets
from pipeline.tracking import StoreWriteError, Tracker, TrackingError

JUDGE_TEMPLATES = [
    {
        "name": "single-v1",
        "type": "single",
        "system_prompt": "You are a helpful judge.",
        "prompt_template": "[Question]\n{question}\n[Answer]\n{answer}\nRate it as [[rating]].",
        "output_format": "[[rating]]",
    },
    {
        "name": "single-v1-multi-turn",
        "type": "single",
        "system_prompt": "You are a helpful judge of the second turn.",
        "prompt_template": "Q1 {question_1}\nA1 {answer_1}\nQ2 {question_2}\nA2 {answer_2}\n"
        "Rate the second answer as [[rating]].",
        "output_format": "[[rating]]",
    },
]


def _judged_project(tmp_path):
    root = make_project(tmp_path)
    (root / "data" / "tiny_mt" / "judge_prompts.jsonl").write_text(
        "\n".join(json.dumps(t) for t in JUDGE_TEMPLATES) + "\n"
    )
    return root


def _judge_args(url: str, *extra: str) -> list[str]:
    return [
        "sweep.methods=[ar]",
        "sweep.datasets=[tiny_mt]",
        "judge.enabled=true",
        "judge.kind=openai",
        f"judge.base_url={url}",
        "judge.model=tiny-judge",
        "judge.max_retries=0",
        *extra,
    ]


def _client(out):
    client = MlflowClient(out["tracking_uri"])
    return client, client.get_experiment_by_name("tiny").experiment_id


# three sweeps against a judge that goes down and comes back: 25 s alone, ~160 s beside another Ray test
@pytest.mark.slow  # opt-in (make test-slow)
def test_openai_judge_scores_then_keeps_generations_when_down_and_rejudges_them(ray_session, tmp_path):
    root = _judged_project(tmp_path)
    with JudgeServer() as server:
        server.healthy = False  # reachable (/models answers) but every judgment fails
        first = run_sweep(root, *_judge_args(server.url))
        assert first["ran"] == 1 and first["failed"] == 1
        (row,) = first["rows"]
        assert row["cell_status"] == "score_failed" and "score stage" in row["error"]
        client, exp = _client(first)
        (run,) = client.search_runs([exp], "tags.kind = 'cell'")
        assert run.data.metrics["new_tokens"] > 0 and "score" not in run.data.metrics
        assert "samples.jsonl" in {f.path for f in client.list_artifacts(run.info.run_id)}
        generate_s = run.data.metrics["stage_generate_s"]
        samples_before = [
            json.loads(x)
            for x in open(client.download_artifacts(run.info.run_id, "samples.jsonl", str(tmp_path / "a")))
            .read()
            .splitlines()
        ]

        server.healthy = True
        second = run_sweep(root, *_judge_args(server.url))
        assert second["ran"] == 0 and second["rescored"] == 1 and second["failed"] == 0  # no Ray actor, no generation
        assert server.chat_requests == 4  # 2 questions x 2 turns judged
        (row,) = second["rows"]
        assert row["cell_status"] == "finished" and row["score"] == 7.0 and row["run_id"] == run.info.run_id
        again = client.get_run(run.info.run_id)
        assert again.data.metrics["stage_generate_s"] == generate_s
        assert json.loads(again.data.tags["judge"])["model"] == "tiny-judge" and "error" not in again.data.tags
        samples_after = [
            json.loads(x)
            for x in open(client.download_artifacts(run.info.run_id, "samples.jsonl", str(tmp_path / "b")))
            .read()
            .splitlines()
        ]
        assert [s["prediction"] for s in samples_after] == [s["prediction"] for s in samples_before]
        assert all(s["score_detail"]["score"] == 7.0 for s in samples_after)
        assert len(client.search_runs([exp], "tags.kind = 'cell'")) == 1

        # the same judge behind another address: nothing to do; another judge model: re-judged in place
        third = run_sweep(root, *_judge_args(server.url.replace("127.0.0.1", "localhost")))
        assert third["ran"] == 0 and third["rescored"] == 0 and third["skipped"] == 1
        fourth = run_sweep(root, *_judge_args(server.url, "judge.max_new_tokens=32"))
        assert fourth["ran"] == 0 and fourth["rescored"] == 1 and server.chat_requests == 8


def test_openai_judge_scores_in_the_cell_and_a_dead_endpoint_fails_before_models_load(ray_session, tmp_path):
    root = _judged_project(tmp_path)
    with JudgeServer(rating=6) as server:
        out = run_sweep(root, *_judge_args(server.url))  # the default judge.max_new_tokens (the reported TypeError)
        assert out["ran"] == 1 and out["finished"] == 1
        (row,) = out["rows"]
        assert row["score"] == 6.0 and row["score_metric"]
        url = server.url
    with pytest.raises(SweepConfigError, match=r"judge endpoint .*/models is not reachable.*judge.base_url"):
        run_sweep(root, *_judge_args(url), "seeds=[1]")
    client, exp = _client(out)
    assert len(client.search_runs([exp], "tags.kind = 'cell'")) == 1  # nothing ran for seed 1
    with pytest.raises(SweepConfigError, match="judge.model"):
        with JudgeServer() as server:
            run_sweep(root, *_judge_args(server.url, "judge.model=other"), "seeds=[1]")


def test_judge_settings_are_not_part_of_the_cell_key(tmp_path):
    root = make_project(tmp_path)
    keys = []
    for extra in (
        [],
        ["judge.enabled=true", "judge.kind=openai", "judge.base_url=http://a:1/v1", "judge.model=m"],
        ["judge.enabled=true", "judge.kind=openai", "judge.base_url=http://b:2/v1", "judge.model=m"],
    ):
        cfg = sweep.compose(["sweep=tiny", "sweep.datasets=[tiny_mt]", *extra], root / "conf")
        keys.append(sorted(c.key for c in sweep.expand(cfg, root).cells))
    assert keys[0] == keys[1] == keys[2]
    cfg = sweep.compose(["sweep=tiny", "judge.enabled=true", "judge.kind=openai", "judge.model=m"], root / "conf")
    with pytest.raises(sweep.SweepConfigError, match="judge.base_url"):
        sweep.expand(cfg, root)


@pytest.mark.slow  # ~65 s here, opt-in (make test-slow)
def test_logging_that_dies_halfway_leaves_the_cell_unfinished_and_it_runs_again(ray_session, tmp_path, monkeypatch):
    root = make_project(tmp_path)
    args = [
        "sweep.methods=[ar]",
        "sweep.datasets=[{dataset: humaneval, limit: 1, max_new_tokens: 4}]",
        "cluster.cpu_isolation=exclusive",
    ]
    real = MlflowClient.log_text

    def upload_fails(self, run_id, text, artifact_file):
        if artifact_file == "result.json":
            raise OSError("artifact store went away (test)")
        return real(self, run_id, text, artifact_file)

    monkeypatch.setattr(MlflowClient, "log_text", upload_fails)
    monkeypatch.setattr(
        Tracker, "mark_log_failed", lambda self, run_id, error: None
    )  # the store is gone: nothing closes it
    with pytest.raises(StoreWriteError, match="failed while logging cell .* run the same command"):
        run_sweep(root, *args)  # the first logging failure ends the sweep with one message
    client = MlflowClient(f"sqlite:///{root}/mlflow.db")
    exp = client.get_experiment_by_name("tiny").experiment_id
    (half,) = client.search_runs([exp], "tags.kind = 'cell'")
    assert half.data.tags["cell_status"] == "logging" and half.info.status == "RUNNING"  # never taken as finished
    monkeypatch.undo()

    second = run_sweep(root, *args)
    assert second["ran"] == 1 and second["finished"] == 1  # retried
    old = client.get_run(half.info.run_id)
    assert old.info.status == "KILLED" and old.info.lifecycle_stage == "deleted"  # closed as stale, then superseded
    (done,) = client.search_runs([exp], "tags.kind = 'cell'")
    assert done.data.tags["cell_status"] == "finished"
    assert {"samples.jsonl", "result.json", "cell_config.yaml"} <= {
        f.path for f in client.list_artifacts(done.info.run_id)
    }
    # CPU isolation recorded with the cell: alone on the 2-CPU Ray node, with both cores as torch threads
    # (not Ray's OMP_NUM_THREADS default of the actor's CPUs, nor a fixed 1)
    assert done.data.tags["cpu_isolation"] == "exclusive"
    assert done.data.params["isolation.threads"] == "2" and done.data.params["isolation.torch_threads"] == "2"
    assert run_sweep(root, *args)["ran"] == 0


def test_score_fault_fires_and_keeps_generations(ray_session, tmp_path):
    root = make_project(tmp_path)
    args = ["sweep.methods=[ar]", "sweep.datasets=[{dataset: humaneval, limit: 1, max_new_tokens: 4}]"]
    out = run_sweep(root, *args, "+fault_injection={kind: raise, stage: score}")
    (row,) = out["rows"]
    assert row["cell_status"] == "score_failed" and "injected fault in stage 'score'" in row["error"]
    again = run_sweep(root, *args)
    assert again["ran"] == 0 and again["rescored"] == 1
    (row,) = again["rows"]
    assert row["cell_status"] == "finished" and 0 <= row["score"] <= 1


def test_an_unreachable_tracking_server_fails_in_seconds_before_ray(tmp_path, monkeypatch):
    def no_ray(cluster):
        raise AssertionError("Ray was started before the tracking URI was checked")

    monkeypatch.setattr(driver, "start_ray", no_ray)
    root = make_project(tmp_path)
    cfg = sweep.compose(["sweep=tiny", "tracking.uri=http://127.0.0.1:9", "progress=false"], root / "conf")
    t0 = time.monotonic()
    with pytest.raises(TrackingError, match="not reachable.*tracking.uri"):
        sweep.run(cfg, root=root)
    assert time.monotonic() - t0 < 60


@pytest.mark.slow  # ~30 s here, opt-in (make test-slow)
def test_pinned_isolation_binds_each_cell_to_its_own_cores(ray_session, tmp_path):
    sets = core_sets(1, 8)
    assert all(len(s) == 1 for s in sets) and len({c for s in sets for c in s}) == len(sets)  # disjoint
    root = make_project(tmp_path)
    out = run_sweep(
        root,
        "sweep.methods=[ar]",
        "sweep.datasets=[{dataset: humaneval, limit: 1, max_new_tokens: 4}]",
        "seeds=[0,1]",
        "cluster.cpu_isolation=pinned",
        "cluster.cpus_per_cell=1",
    )
    assert out["finished"] == 2
    client, exp = _client(out)
    for run in client.search_runs([exp], "tags.kind = 'cell'"):
        p = run.data.params
        assert run.data.tags["cpu_isolation"] == "pinned" and p["isolation.torch_threads"] == "1"
        assert len(json.loads(p["isolation.affinity"])) == 1 and p["isolation.affinity"] == p["isolation.cores"]


@pytest.mark.slow  # ~65-80 s here, opt-in (make test-slow)
def test_a_store_deleted_mid_sweep_stops_scheduling_and_the_same_command_resumes(ray_session, tmp_path, monkeypatch):
    root = make_project(tmp_path)
    args = ["sweep.datasets=[{dataset: humaneval, limit: 1, max_new_tokens: 4}]", "cluster.max_in_flight=1"]
    logged, claimed = [], []
    real_log, real_claim = Tracker.log_cell, Tracker.claim

    def log_after_the_store_is_deleted(self, cell, result):
        logged.append(cell.key)
        (root / "mlflow.db").unlink(missing_ok=True)  # the store goes away under the driver
        return real_log(self, cell, result)

    def counting_claim(self, key):
        claimed.append(key)
        return real_claim(self, key)

    monkeypatch.setattr(Tracker, "log_cell", log_after_the_store_is_deleted)
    monkeypatch.setattr(Tracker, "claim", counting_claim)
    with pytest.raises(StoreWriteError) as failure:
        run_sweep(root, *args)
    message = str(failure.value)
    assert "failed while logging cell" in message and "run the same command" in message and "resumes" in message
    assert "\n" not in message
    # the three cells (ar, spd, block), one at a time: the first result's failed write stopped the sweep
    assert len(logged) == 1 and len(claimed) == 1
    monkeypatch.undo()
    # "the same command" is a new process: here, drop MLflow's per-URI store (its connections to the deleted file)
    TrackingStoreRegistry._get_store_with_resolved_uri.cache_clear()
    for uri in [u for u in SqlAlchemyStore._engine_map if str(root) in u]:
        SqlAlchemyStore._engine_map.pop(uri).dispose()
    again = run_sweep(root, *args)
    assert again["ran"] == 3 and again["finished"] == 3


def test_the_sweep_command_turns_a_store_failure_into_one_line_and_exit_1(tmp_path):
    code = (
        "import runpy, sys\nimport pipeline.sweep.driver as d\nfrom pipeline.tracking import StoreWriteError\n"
        "def run(cfg):\n"
        "    raise StoreWriteError('the tracking store x failed while logging cell k (OSError: gone). "
        "run the same command')\n"
        "d.run = run\nsys.argv = ['pipeline.sweep', 'hydra.run.dir=" + str(tmp_path) + "']\n"
        "runpy.run_module('pipeline.sweep', run_name='__main__', alter_sys=True)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr
    assert out.stderr.strip().splitlines() == [
        "error: the tracking store x failed while logging cell k (OSError: gone). run the same command"
    ]
