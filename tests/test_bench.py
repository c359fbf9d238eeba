"""python -m pipeline.bench on the offline pair, at a size that runs in seconds."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import yaml
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import OmegaConf

from helpers.paths import CONF, REPO
from pipeline.bench import plan, report, runners
from pipeline.bench.batched import BatchBench
from pipeline.bench.runners import Bench
from pipeline.device import machine_info
from pipeline.measure import energy

FIELDS = {
    "impl",
    "method",
    "mode",
    "tokens_per_s",
    "ratio_to_transformers",
    "identical_to_transformers",
    "alpha",
    "c",
    "bound",
    "efficiency",
}


def _cfg(*overrides: str):
    GlobalHydra.instance().clear()  # pipeline.sweep.compose leaves Hydra initialised
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose(config_name="bench", overrides=list(overrides))


def test_default_pair_as_shipped_with_every_drafter(monkeypatch):
    """The restricted-head draft runs in our rows; transformers' assisted row says why it cannot; prompt
    lookup runs in both; methods that cannot use a drafter get a row saying so. Prompt lookup's cost is counted,
    not timed: its rows run no draft forward (the draft model's do), and its ``c`` is its own drafter's."""
    timed: list[dict] = []
    original = Bench._timed

    def keep(self, runners, engines=None):
        results, clocks = original(self, runners, engines)
        timed.append(results)
        return results, clocks

    monkeypatch.setattr(Bench, "_timed", keep)
    cfg = _cfg(
        "gamma=2",
        "repeats=1",
        "warmup=0",
        "probe_reps=2",
        "max_new_tokens=5",
        "methods=[ar,spd,specinfer]",
        "drafters=[model,ngram]",
        "modes=[greedy]",
        "prompts=[Repeat after me: one two three one two three.]",
    )
    bench = Bench(cfg)
    rows, costs = bench.run()
    got = {(r.impl, r.method, r.drafter): r for r in rows}
    assert "restricted head" in got[("transformers", "spd", "model")].note
    assert got[("transformers", "spd", "ngram")].tokens == 5
    assert "cannot use drafter: ngram" in got[("ours", "specinfer", "ngram")].note
    for key in [("ours", "spd", "model"), ("ours", "spd", "ngram"), ("ours", "specinfer", "model")]:
        assert got[key].tokens == 5 and got[key].identical_to_transformers is True
    gens = {key: value[3] for results in timed for key, value in results.items()}
    assert sum(g.draft_steps for g in gens[("ours", "spd", "ngram")]) == 0  # no model drafts: a lookup
    assert sum(g.draft_steps for g in gens[("ours", "spd", "model")]) > 0
    # its c is its own loop's clock: the draft phase per position over its plain step, the median over its passes
    passes = bench.clocks["greedy"][("ours", "spd", "ngram")]
    assert got[("ours", "spd", "ngram")].c == pytest.approx(statistics.median(p["cost_ratio_c"] for p in passes))
    md = report.to_markdown("t", rows, costs, {}, "python -m pipeline.bench ...", cfg)
    assert "Rows not run:" in md and "| ours | spd | ngram | 2 | greedy |" in md
    assert "\nEnergy: " in md  # a table where this machine has a meter (auto: RAPL on a CPU), else why not


def test_each_method_runs_its_own_gamma_unless_one_is_given(monkeypatch):
    """gamma: null (the default) takes method_params.<method>.gamma, else the method's conf/method/<method>.yaml
    gamma; every draft length gets its own t_verify and each row's bound uses its own; gamma=N sets them all."""
    conf = {m: yaml.safe_load((REPO / "conf" / "method" / f"{m}.yaml").read_text())["gamma"] for m in ("spd", "mtad")}
    cfg = _cfg(
        "~method_params.spd",
        "repeats=1",
        "warmup=0",
        "probe_reps=1",
        "max_new_tokens=4",
        "methods=[ar,spd,mtad]",
        "drafters=[model]",
        "modes=[sample]",
        "prompts=[Count: one two three]",
        "++method_params.mtad.gamma=" + str(conf["spd"] + 1),
    )
    bench = Bench(cfg)
    assert bench.gamma_of("ar") is None and bench.gamma_of("spd") == conf["spd"]
    assert bench.gamma_of("mtad") == conf["spd"] + 1  # method_params.<method>.gamma over conf/method
    assert bench.gammas() == [conf["spd"], conf["spd"] + 1]
    rows, costs = bench.run()
    got = {r.method: r for r in rows if r.impl == "ours"}
    assert got["ar"].gamma is None and got["spd"].gamma == conf["spd"] and got["mtad"].gamma == conf["spd"] + 1
    for g in bench.gammas():
        assert costs[f"t_verify_g{g}_ms"] > 0 and costs[f"verify_over_ar_g{g}"] > 0
    assert costs["t_verify_ms"] == costs[f"t_verify_g{conf['spd'] + 1}_ms"]  # the longest verification
    md = report.to_markdown("t", rows, costs, {}, "python -m pipeline.bench ...", cfg)
    assert (
        "gamma per method (method_params.<method>.gamma, else conf/method/<method>.yaml; gamma=N sets every method's): "
        f"spd {conf['spd']}, mtad {conf['spd'] + 1}" in md
    )
    assert f"t_verify({conf['spd']}+1) / t_ar" in md and f"t_verify({conf['spd'] + 1}+1) / t_ar" in md
    one = Bench.__new__(Bench)
    one.cfg = _cfg("gamma=5")
    assert one.gamma_of("spd") == 5 and one.gamma_of("mtad") == 5 and one.gamma_of("ar") is None


@pytest.mark.slow  # the real model in fp32 where the CPU has no bf16 kernels: ~30 s here, opt-in (make test-slow)
def test_bench_rows_on_the_offline_pair(tmp_path):
    cfg = _cfg(
        "pair.draft.restrict_head=false",
        "gamma=2",
        "repeats=2",
        "warmup=0",
        "probe_reps=2",
        "max_new_tokens=6",
        "methods=[ar,spd,block]",
        "drafters=[model]",
        "prompts=[Write a haiku about the sea.]",
    )
    bench = Bench(cfg)
    rows, costs = bench.run()
    assert {(r.impl, r.method, r.mode) for r in rows} == {
        (impl, m, mode)
        for mode in ("greedy", "sample")
        for impl, m in [
            ("transformers", "ar"),
            ("transformers", "spd"),
            ("ours", "ar"),
            ("ours", "spd"),
            ("ours", "block"),
        ]
    }
    for r in rows:
        assert r.tokens_per_s > 0 and r.tokens == 6
        if r.impl == "ours":
            assert r.ratio_to_transformers > 0 and 0.0 <= r.overhead_per_step < 1.0
            if r.mode == "greedy":
                assert r.identical_to_transformers is True
            if r.method != "ar":
                assert 0.0 <= r.alpha <= 1.0 and r.c > 0 and r.bound > 0 and r.efficiency > 0
    assert costs["t_ar_ms"] > 0 and costs["t_verify_ms"] > 0 and 0 < costs["c"] < 1
    # each chain method's own proposal cost is its row's t_draft (MTAD's beams are dearer than the chain)
    assert costs["t_propose_spd_model_ms"] > 0 and costs["t_propose_block_model_ms"] > 0
    # a row's c: the median over its mode's passes of its own loop's clock (the draft phase per position over its
    # plain step), no second timing path; its phases' shares sum to 1; the summary's c is the reference's
    for r in rows:
        if r.impl == "ours":
            passes = bench.clocks[r.mode][("ours", r.method, r.drafter)]
            assert len(passes) == 2 and r.t_step_ms == pytest.approx(
                statistics.median(p["t_target_step_ms"] for p in passes)
            )
            shares = [r.share_draft, r.share_verify, r.share_rule, r.share_other]
            assert sum(shares) == pytest.approx(1.0) and r.share_verify > 0
            if r.method != "ar":
                assert r.c == pytest.approx(statistics.median(p["cost_ratio_c"] for p in passes))
                assert r.share_draft > 0 and r.speedup_normalized > 0
    assert costs["c"] == costs["c_model"] > 0
    info = machine_info(bench.device)
    info["engine"] = report.engine_info(bench.pair)
    dtype = bench.pair.precision()["target_dtype"]
    assert (
        f"target {dtype} through the lean forward, kernels {bench.pair.precision()['target_kernels']}" in info["engine"]
    )
    # the roofline: a floor from the copy bandwidth, and the steps against it
    assert costs["bandwidth_gb_s"] > 0 and costs["floor_target_ms"] > 0
    assert costs["ar_over_floor"] == pytest.approx(costs["t_ar_ms"] / costs["floor_target_ms"])
    assert costs["verify_over_ar"] == pytest.approx(costs["t_verify_ms"] / costs["t_ar_ms"])
    assert costs["target_mb"] == pytest.approx(runners.streamed_bytes(bench.pair.target) / 1e6)
    md = report.to_markdown("t", rows, costs, info, "python -m pipeline.bench ...", cfg)
    assert md.count("\n| ours |") == 6 and f"Our engine: target {dtype} through the lean forward" in md
    assert "Roofline: copy bandwidth" in md and "t_ar / floor" in md
    payload = [dict(vars(r)) for r in rows]
    (tmp_path / "t.json").write_text(json.dumps(payload))
    assert FIELDS <= set(json.loads((tmp_path / "t.json").read_text())[0])


@pytest.mark.parametrize(
    "override, message",
    [
        ("methods=[ar,nope]", "unknown method 'nope'"),
        ("method_params.mtad.tau=2", r"tau=2 must be a number in \[0.0, 1.0\]"),
        ("modes=[greedy,beam]", "unknown mode 'beam'"),
        ("drafters=[nope]", "unknown drafter 'nope'"),
        ("energy_meter=nvml+smi", r"unknown energy meter 'nvml\+smi'; valid: auto, nvml, rapl, zeus, none"),
        # issue 36 item 8: each of these ended in a traceback after the pair had loaded
        ("repeats=0", r"repeats=0: must be an integer >= 1 \(timed passes.*\(e.g. repeats=5\)"),
        ("probe_reps=0", r"probe_reps=0: must be an integer >= 1"),
        ("warmup=-1", r"warmup=-1: must be an integer >= 0"),
        ("prompts=[]", r"prompts=\[\]: must be a non-empty list of non-empty texts"),
        ("max_new_tokens=0", r"max_new_tokens=0: must be an integer >= 1"),
        ("threads=-1", r"threads=-1: must be null or an integer >= 1"),
        ("gamma=0", r"gamma=0: must be null or an integer >= 1"),
        ("idle_seconds=nan", r"idle_seconds=nan: must be a finite number >= 0"),
        ("seed=99999999999999999999", r"seed: 99999999999999999999 is out of range"),
        ("sampling.temperature=inf", r"sampling.temperature=inf: must be a finite number"),
        ("draft_stops=[none,sometimes]", r"draft_stops has \['sometimes'\]: choose from \['none', 'confidence'"),
        # issue 47: the batch settings, before any model loads (0 is refused, not read as the default)
        ("batch_requests=-1", r"batch_requests=-1: must be null \(twice the largest batch size\) or an integer in"),
        ("batch_requests=x", r"batch_requests=x: must be null"),
        ("batch_requests=0", r"batch_requests=0: must be null"),
        ("batch_requests=1.5", r"batch_requests=1.5: must be null"),
        ("batch_requests=true", r"batch_requests=True: must be null"),
        ("batch_requests=99999999999999999999", r"batch_requests=99999999999999999999: must be null"),
        ("batch_requests=1000000", r"batch_requests=1000000: must be null .* in \[1, 1024\]"),
        (
            "batch_sizes=[1000000]",
            r"batch_sizes=\[1000000\]: must be null or a non-empty list of integers in \[1, 256\]",
        ),
        ("batch_sizes=[0,2]", r"batch_sizes=\[0, 2\]: must be null or a non-empty list"),
        ("batch_sizes=[x]", r"batch_sizes=\['x'\]: must be null or a non-empty list"),
        ("batch_sizes=[]", r"batch_sizes=\[\]: must be null or a non-empty list"),
        ("batch_sizes=[nan]", r"batch_sizes=\[nan\]: must be null or a non-empty list"),
        ("batch_sizes=[8] batch_requests=4", r"batch_sizes has 8 but batch_requests=4"),
        # issue 57: a draft length was rounded (2.7 ran as 2, true as 1)
        ("++method_params.spd.gamma=2.7", r"method_params.spd.gamma=2.7: the draft length must be an integer >= 1"),
        ("++method_params.spd.gamma=true", r"method_params.spd.gamma=True: the draft length must be an integer"),
        ("++method_params.spd.gamma=0", r"method_params.spd.gamma=0: the draft length must be an integer >= 1"),
    ],
)
def test_bad_bench_settings_fail_before_any_model_loads(override, message, monkeypatch):
    monkeypatch.setattr(runners, "load_pair", lambda *a, **k: pytest.fail("a model was loaded"))
    with pytest.raises(ValueError, match=message):
        Bench(_cfg(*override.split(" ")))


def test_a_prompt_past_the_context_fails_before_any_model_loads(monkeypatch):
    """Issue 57: a prompt that with max_new_tokens does not fit the target's context ended in a traceback after the
    pair had loaded; it is refused from the tokenizer alone, naming the prompt and the fix."""
    from pipeline.sweep.checks import context_length  # noqa: PLC0415

    monkeypatch.setattr(runners, "load_pair", lambda *a, **k: pytest.fail("a model was loaded"))
    context = context_length(OmegaConf.to_container(_cfg().pair, resolve=True))
    assert context is not None
    with pytest.raises(ValueError, match=rf"prompts\[1\] \(\d+ tokens\) \+ max_new_tokens \({context - 36}\) exceeds "):
        long = " ".join(["Name a colour and say why it is your favourite"] * 3)
        Bench(_cfg(f"max_new_tokens={context - 36}", f"prompts=[Hi,{long}]"))


def test_the_bench_command_exits_2_on_bad_settings_before_loading(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "pipeline.bench", "repeats=0", "threads=-1", f"out_dir={tmp_path}"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    assert (
        "repeats=0: must be an integer >= 1" in out.stderr
        and "threads=-1" in out.stderr
        and not list(tmp_path.iterdir())
    )


def test_a_bench_whose_every_row_was_refused_exits_2_and_keeps_the_earlier_file(tmp_path, monkeypatch, capsys):
    """Every row refused (a note, no tokens/s): exit 2 naming the reasons, and an earlier table of the same name is
    left as it was (it was overwritten by an empty table, exit 0)."""
    from pipeline.bench import __main__ as bench_main  # noqa: PLC0415
    from pipeline.bench.batched import BatchRow  # noqa: PLC0415

    earlier = tmp_path / "t-batching.md"
    earlier.write_text("an earlier table")
    refused = [BatchRow("ours", "beam", "sample", 2, note="beam decodes one sequence at a time")]
    monkeypatch.setattr(bench_main, "BatchBench", lambda bench, cfg: SimpleNamespace(run=lambda: refused))
    monkeypatch.setattr(bench_main, "REPO_ROOT", tmp_path)
    cfg = OmegaConf.create({"out_dir": ".", "batch_sizes": [2]})
    with pytest.raises(SystemExit) as exit_:
        bench_main.main_batched(cfg, SimpleNamespace(meter=SimpleNamespace(close=lambda: None)), "t")
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "every row of the bench was refused" in err and "beam decodes one sequence at a time" in err
    assert earlier.read_text() == "an earlier table" and sorted(p.name for p in tmp_path.iterdir()) == [earlier.name]
    # one measured row is a table: the guard lets it through
    bench_main._refuse_if_nothing_ran([BatchRow("ours", "ar", "sample", 2, tokens_per_s=10.0), *refused], earlier)


def test_the_ngram_drafter_alone_writes_its_rows(tmp_path):
    """drafters=[ngram] measured every pass and then crashed on the summary (KeyError 'c_model'), writing nothing."""
    args = [
        "drafters=[ngram]",
        "methods=[ar,spd]",
        "modes=[greedy]",
        "gamma=2",
        "repeats=1",
        "warmup=0",
        "probe_reps=1",
        "max_new_tokens=4",
        "energy_meter=none",
        "prompts=[one two one two one two]",
        "name=ngram",
        f"out_dir={tmp_path}",
    ]
    out = subprocess.run(
        [sys.executable, "-m", "pipeline.bench", *args], cwd=REPO, capture_output=True, text=True, timeout=600
    )
    assert out.returncode == 0, out.stderr[-3000:]
    rows = json.loads((tmp_path / "ngram.json").read_text())
    spd = [r for r in rows if r["impl"] == "ours" and r["method"] == "spd"]
    assert len(spd) == 1 and spd[0]["drafter"] == "ngram" and spd[0]["tokens_per_s"] > 0 and spd[0]["c"] > 0
    assert any(
        r["impl"] == "transformers" and r["method"] == "spd" and r["drafter"] == "ngram" for r in rows
    )  # prompt lookup
    costs = json.loads((tmp_path / "ngram.meta.json").read_text())["costs"]
    assert costs["c"] == costs["c_ngram"] and "t_draft_model_ms" not in costs and "draft_over_floor" not in costs
    md = (tmp_path / "ngram.md").read_text()
    assert "ngram" in md and "| ours | spd | ngram |" in md


def test_eagle_without_a_head_fails_before_any_model_loads(monkeypatch):
    monkeypatch.setattr(runners, "load_pair", lambda *a, **k: pytest.fail("a model was loaded"))
    with pytest.raises(ValueError, match="no `eagle:` head"):
        Bench(_cfg("drafters=[eagle]", "++pair.eagle=null", "++pair.drafter=model"))


def test_tree_methods_are_benched_without_a_chain_bound():
    cfg = _cfg(
        "pair.draft.restrict_head=false",
        "gamma=2",
        "repeats=1",
        "warmup=0",
        "probe_reps=2",
        "max_new_tokens=4",
        "methods=[ar,specinfer]",
        "drafters=[model]",
        "modes=[greedy]",
        "prompts=[Name a colour.]",
    )
    rows, _ = Bench(cfg).run()
    tree = [r for r in rows if r.method == "specinfer"][0]
    assert tree.tokens == 4 and tree.identical_to_transformers is True  # lossless at T = 0
    assert tree.alpha is None and tree.bound is None and tree.efficiency is None


def test_timed_passes_draw_with_their_own_seeds_and_pool_the_generations():
    """Every timed pass gives prompt i its own seed offset (the same for every runner, never the warm-up's),
    so acceptance figures pool independent samples; rates are per pass, outputs the last pass's."""
    bench = object.__new__(Bench)
    bench.cfg = OmegaConf.create({"warmup": 1, "repeats": 3})
    bench.prompts = [[1, 2], [3], [4, 5, 6]]
    bench.device = torch.device("cpu")
    bench.meter, bench.idle = energy.NullMeter("energy_meter=none"), None
    seen = {"a": [], "b": []}

    def runner(name):
        def run_one(i, ids):
            seen[name].append(i)
            return [i] * len(ids), (name, i)

        return run_one

    results, clocks = bench._timed({"a": runner("a"), "b": runner("b")})
    assert clocks == {}  # no runner of ours (no loop's clock) here
    assert seen["a"] == seen["b"]
    warm, timed = seen["a"][:3], seen["a"][3:]
    assert warm == [0, 1, 2] and len(set(timed)) == 9 and not set(timed) & set(warm)
    rates, tokens, outs, gens = results["a"]
    assert len(rates) == 3 and tokens == 6 and outs == [[i] * n for i, n in zip(timed[-3:], (2, 1, 3))]
    assert gens == [("a", i) for i in timed]


def _zone(root: Path, name: str) -> Path:
    """A RAPL package zone (the sysfs layout RaplMeter reads) whose counter the runners below advance."""
    zone = root / name
    zone.mkdir(parents=True)
    (zone / "name").write_text("package-0\n")
    (zone / "energy_uj").write_text("0\n")
    (zone / "max_energy_range_uj").write_text("1000000000000\n")
    return zone


def _spend(zone: Path, uj: int) -> None:
    (zone / "energy_uj").write_text(f"{int((zone / 'energy_uj').read_text()) + uj}\n")


def test_every_runners_pass_is_one_metered_window(tmp_path):
    """With a meter, each runner's pass over the prompts is a window: J/token per pass and runner, idle power
    once before the passes, and a reference meter's reading of the same windows beside ours."""
    ours, ref = _zone(tmp_path, "intel-rapl:0"), _zone(tmp_path, "intel-rapl:1")
    bench = object.__new__(Bench)
    bench.cfg = OmegaConf.create({"warmup": 1, "repeats": 2, "idle_seconds": 0.2})
    bench.prompts = [[1, 2], [3]]
    bench.device = torch.device("cpu")
    bench.meter = energy.PairedMeter(energy.RaplMeter([ours]), energy.RaplMeter([ref]))
    bench.idle = None
    cost = {"a": 1000, "b": 3000}  # uJ per new token: b spends 3x a's energy per token

    def runner(name):
        def run_one(i, ids):
            _spend(ours, cost[name] * len(ids))
            _spend(ref, cost[name] * len(ids) * 99 // 100)  # the reference reads 1% less
            return list(ids), None

        return run_one

    bench._timed({"a": runner("a"), "b": runner("b")})
    assert (
        bench.idle.available and bench.idle.power_w == 0.0 and bench.idle.reference_power_w == 0.0
    )  # nothing spent idling
    for name in ("a", "b"):
        passes = bench.energy[name]
        assert len(passes) == 2
        for p in passes:
            assert p["j_per_token"] == pytest.approx(cost[name] / 1e6)
            assert p["reference_j_per_token"] == pytest.approx(cost[name] * 0.99 / 1e6)
            assert p["energy_vs_reference"] == pytest.approx(1 / 0.99 - 1)
            assert p["dynamic_j_per_token"] == pytest.approx(p["j_per_token"])  # idle power 0
    row = plan.Row("ours", "spd", "sample", 1.0, 3)
    runners._energy_figures(row, bench.energy["b"])
    assert row.j_per_token == pytest.approx(0.003) and row.energy_vs_reference == pytest.approx(1 / 0.99 - 1)
    costs = {"energy_meter": bench.meter.info(), "idle_power_w": 0.0, "reference_idle_power_w": 0.0}
    lines = "\n".join(report._energy_lines([row], costs))
    assert (
        "Energy: meter rapl+rapl" in lines and "| ours | spd | – | sample | 0.0030 | 0.0030 | 0.0030 | 1.01% |" in lines
    )
    unmetered = report._energy_lines(
        [row], {"energy_meter": energy.NullMeter("no readable RAPL package counter").info()}
    )
    assert unmetered == ["", "Energy: not measured (no readable RAPL package counter)."]


def test_every_batched_pass_is_one_metered_window(tmp_path, monkeypatch):
    """The batch-size table meters each runner's pass as one window: J/token per batch size (ours, idle-subtracted,
    the reference meter's), idle power once before the passes; the Markdown shows the columns."""
    ours, ref = _zone(tmp_path, "intel-rapl:0"), _zone(tmp_path, "intel-rapl:1")
    meter = energy.PairedMeter(energy.RaplMeter([ours]), energy.RaplMeter([ref]))
    bench = SimpleNamespace(meter=meter, idle=None, device=torch.device("cpu"), prompts=[[1, 2], [3]], batch_skipped={})
    cfg = OmegaConf.create(
        {"batch_sizes": [1, 2], "batch_requests": 2, "modes": ["greedy"], "methods": ["ar"], "warmup": 1}
        | {"repeats": 2, "idle_seconds": 0.2, "seed": 0, "max_new_tokens": 2, "ignore_eos": True}
        | {"pair": {"name": "p"}, "prompts": ["a", "b"], "sampling": {}, "method_params": {}}
    )
    batched = BatchBench(bench, cfg)
    uj_per_token = {"ours": 1000, "transformers": 4000}

    def runner(impl, b):
        def run(p):
            tokens = 2 * b  # a larger batch spends the same per token here; the meter must see each pass alone
            _spend(ours, uj_per_token[impl] * tokens)
            _spend(ref, uj_per_token[impl] * tokens * 98 // 100)
            return tokens, 0.01, [{"tokens": 2, "steps": 2, "latency": 0.01, "first": 0.001}] * 2

        return run

    monkeypatch.setattr(batched, "_ours", lambda method, mode, b: runner("ours", b))
    monkeypatch.setattr(batched, "_transformers", lambda mode, b: runner("transformers", b))
    rows = batched.run()
    assert bench.idle is not None and bench.idle.available and bench.idle.power_w == 0.0
    assert {(r.impl, r.batch_size) for r in rows} == {
        ("ours", 1),
        ("ours", 2),
        ("transformers", 1),
        ("transformers", 2),
    }
    for r in rows:
        assert r.j_per_token == pytest.approx(uj_per_token[r.impl] / 1e6)
        assert r.dynamic_j_per_token == pytest.approx(r.j_per_token)  # idle power 0
        assert r.reference_j_per_token == pytest.approx(uj_per_token[r.impl] * 0.98 / 1e6)
    md = report.batch_markdown("t", rows, cfg, "python -m pipeline.bench", {"energy_meter": "rapl+rapl"})
    assert "J/token (dynamic) | reference J/token |" in md and "| 0.001 (0.001) | 0.001 |" in md


def test_adaptive_rows_sit_beside_the_fixed_ones_with_the_hindsight_oracle(tmp_path):
    """draft_stops=[none,confidence]: the chain row at fixed gamma carries the oracle (best fixed gamma per request in
    hindsight, bounds.hindsight_gamma), the confidence row beside it its own drafts per iteration; one table."""
    cfg = _cfg(
        "gamma=3",
        "repeats=1",
        "warmup=0",
        "probe_reps=1",
        "max_new_tokens=8",
        "methods=[ar,spd]",
        "drafters=[model]",
        "modes=[sample]",
        "draft_stops=[none,confidence]",
        "+method_params.spd.draft_threshold=0.9",
        "prompts=[Write a haiku about the sea.]",
    )
    bench = Bench(cfg)
    assert bench.adaptive_runs() == [("spd", "model", "confidence")]
    rows, costs = bench.run()
    fixed = next(r for r in rows if r.impl == "ours" and r.method == "spd" and r.draft_stop is None)
    adaptive = next(r for r in rows if r.draft_stop == "confidence")
    assert fixed.oracle_bound >= fixed.hindsight_fixed > 0 and fixed.oracle_gamma
    assert adaptive.tokens_per_s > 0 and adaptive.mean_drafted <= 3 and adaptive.speedup > 0
    md = report.to_markdown("t", rows, costs, {}, "python -m pipeline.bench ...", cfg)
    assert "hindsight oracle" in md and "| spd | model | sample | confidence | 3 |" in md


def test_the_cost_parameters_tune_the_adaptive_row_and_leave_the_fixed_one():
    """method_params.<m>.draft_cost / verify_cost go to the acceptance row only; the fixed row keeps its key."""
    cfg = _cfg(
        "methods=[ar,spd]",
        "draft_stops=[none,acceptance]",
        "+method_params.spd.draft_cost=0.09",
        "+method_params.spd.verify_cost=0.35",
    )
    p = plan.BenchPlan(cfg)
    fixed = p.method_params("spd", "sample")
    adaptive = p.method_params("spd", "sample", stop="acceptance")
    assert not {"draft_cost", "verify_cost", "draft_stop"} & set(fixed) and fixed["gamma"] == 2
    assert adaptive["draft_stop"] == "acceptance" and (adaptive["draft_cost"], adaptive["verify_cost"]) == (0.09, 0.35)
