"""The engine in bf16: the AVX512-BF16 decoder kernels, batch invariance, exactness, and the dtype choice.

In bf16 the rows of a k-token verification could round differently from the one-token steps that
autoregressive decoding takes; the kernels compute every row by the same instruction sequence whatever
the number of rows, so the two are bit-identical and greedy speculative decoding equals greedy ``ar``
token for token, as in float32. Where the kernels cannot run (no AVX512_BF16, forced off), bf16 goes
through oneDNN and ``auto`` picks float32.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from helpers.exact import PROMPT, WARP, chi_square_pvalue, exact_law, first_tokens
from helpers.marks import HAS_KERNELS, kernels_reason, needs_kernels
from helpers.models import tiny_llama
from helpers.paths import REPO
from pipeline.decoding import build_decoder, cpu_kernels
from pipeline.decoding.drafters import ModelDrafter
from pipeline.decoding.fast_forward import LeanForward, model_kernel_path
from pipeline.decoding.kv import CachedModel
from pipeline.decoding.vocab import restrict_head
from pipeline.decoding.warping import Warper, make_generator
from pipeline.models import ModelSpec, PairSpec, load_model


def bf16_model(seed: int = 0, **kw):
    return tiny_llama(seed, **kw).to(torch.bfloat16)


@needs_kernels
@pytest.mark.parametrize("rows", [1, 2, 3, 5, 8, 13, 33])
def test_kernel_linear_matches_fp32_reference_and_is_row_invariant(rows):
    torch.manual_seed(rows)
    k = cpu_kernels.kernels()
    for out, inp in [(1000, 576), (37, 100), (5, 16), (9, 101)]:  # tails in both dimensions, an odd input
        w = torch.randn(out, inp).bfloat16()
        x = torch.randn(rows, inp).bfloat16()
        packed = k.pack(w)
        y = k.linear(x, packed, out)
        ref = F.linear(x.float(), w.float())
        assert torch.allclose(y.float(), ref, rtol=1e-2, atol=1e-2 * ref.abs().max().item())
        one_by_one = torch.cat([k.linear(x[i : i + 1], packed, out) for i in range(rows)])
        assert torch.equal(y, one_by_one)


@needs_kernels
@pytest.mark.parametrize(
    "kind, extra",
    [
        ("llama", {"heads": 4, "kv_heads": 2, "hidden": 64, "layers": 2}),
        ("mistral", {"heads": 4, "kv_heads": 4, "hidden": 64, "layers": 2, "sliding_window": None}),
        ("qwen2", {"heads": 4, "kv_heads": 1, "hidden": 64, "layers": 2}),  # q/k/v biases
    ],
)
def test_kernel_forward_agrees_with_transformers_in_bf16(kind, extra):
    model = bf16_model(3, vocab=50, kind=kind, **extra)
    if kind == "qwen2":
        with torch.no_grad():
            for layer in model.model.layers:
                for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                    proj.bias.normal_()
    cm = CachedModel(model)
    assert cm.lean is not None and cm.lean.kernel_path == f"bf16-{cpu_kernels.kernels_isa()}"
    ids = torch.randint(0, 50, (1, 20), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref = model(ids).logits[0].float()
        cm.prefill(ids[0, :12].tolist())
        got = torch.cat([cm.forward(ids[0, 12:17].tolist(), keep=5), cm.forward(ids[0, 17:].tolist(), keep=3)])
    # bf16 rounding of the intermediate values only (the same operations, other accumulation orders)
    assert (got - ref[12:]).abs().max() <= 0.05 * ref.abs().max()


# head sizes 16 (the scalar attention), 64 and 128 (the vector attention); 40-wide MLPs cover the SiLU tail
SHAPES = [
    {"hidden": 64, "heads": 4, "kv_heads": 2},
    {"hidden": 128, "heads": 2, "kv_heads": 1, "intermediate": 40},
    {"hidden": 256, "heads": 2, "kv_heads": 2},
]


@needs_kernels
@pytest.mark.parametrize("shape", SHAPES, ids=["d16", "d64", "d128"])
def test_kernel_forward_agrees_with_transformers_per_head_size(shape):
    model = bf16_model(4, vocab=50, layers=2, **shape)
    ids = torch.randint(0, 50, (1, 40), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        ref = model(ids).logits[0].float()
        cm = CachedModel(model)
        cm.prefill(ids[0, :30].tolist())
        got = torch.cat([cm.forward(ids[0, 30:34].tolist(), keep=4), cm.forward(ids[0, 34:].tolist(), keep=6)])
    assert (got - ref[30:]).abs().max() <= 0.05 * ref.abs().max()


def _torch_warp_top_k(logits, k, temperature, top_p):
    """The warp's top-k rows by tensor ops (the path where the kernels are unavailable)."""
    values, index = logits.float().topk(k, dim=-1)
    probs = (values / temperature).softmax(-1)
    if top_p >= 1.0:
        return index, probs
    before = probs.cumsum(-1) - probs
    probs = probs.masked_fill(before >= top_p, 0.0)
    return index, probs / probs.sum(-1, keepdim=True)


@needs_kernels
@pytest.mark.parametrize("vocab,k", [(49152, 10), (1000, 64), (300, 65), (64, 64), (5, 5)])
@pytest.mark.parametrize("temperature,top_p", [(1.0, 0.9), (0.7, 1.0), (1.3, 0.5)])
def test_kernel_warp_topk_agrees_with_the_tensor_ops(vocab, k, temperature, top_p):
    """One C++ call per batch of rows: the same kept ids in the same order, the same top-p prefix,
    probabilities within float32 rounding; bf16 rows as their float32 values; among tied logits the lower
    id first. k > 64 takes the partial-sort path."""
    gen = torch.Generator().manual_seed(vocab + k)
    logits = torch.randn(4, vocab, generator=gen) * 3
    logits[1, : vocab // 2] = logits[1].max() + 1  # a block of ties at the top
    for x in (logits, logits.bfloat16()):
        index, probs = cpu_kernels.kernels().warp_topk(x, k, temperature, top_p)
        ref_index, ref_probs = _torch_warp_top_k(x, k, temperature, top_p)
        assert torch.equal(probs > 0, ref_probs > 0)
        assert torch.allclose(probs, ref_probs, atol=1e-6, rtol=1e-5)
        assert torch.allclose(probs.sum(-1), torch.ones(4))
        assert torch.equal(x.float().gather(-1, index), x.float().gather(-1, ref_index))  # the same values kept
        if x.dtype == torch.float32:  # no ties outside row 1 (bf16 rounding makes some): the same ids
            assert torch.equal(index[[0, 2, 3]], ref_index[[0, 2, 3]])
        tied = min(k, vocab // 2)
        assert index[1, :tied].tolist() == list(range(tied))  # ties: lower id first
    with pytest.raises(RuntimeError, match="temperature"):
        cpu_kernels.kernels().warp_topk(logits, k, 0.0, 1.0)


@needs_kernels
def test_kernel_sample_sparse_is_the_inverse_cdf_in_id_order():
    """The C++ draw equals the tensor-op inverse CDF for the same uniform, zero weights are never drawn,
    and a row without mass is refused."""
    ext = cpu_kernels.kernels()
    gen = torch.Generator().manual_seed(0)
    for trial in range(500):
        k = 1 + trial % 12
        index = torch.randperm(1000, generator=gen)[:k]
        probs = torch.rand(k, generator=gen)
        probs[torch.rand(k, generator=gen) < 0.3] = 0.0
        if probs.sum() == 0:
            probs[0] = 0.5
        u = float(torch.rand(1, generator=gen, dtype=torch.float64))
        order = index.argsort()
        cdf = probs[order].double().cumsum(-1)
        pos = int(
            torch.searchsorted(cdf, torch.tensor([u * float(cdf[-1])], dtype=torch.float64), right=True).clamp(
                max=k - 1
            )
        )
        got = ext.sample_sparse(index, probs, u)
        assert got.dim() == 0 and int(got) == int(index[order][pos])
        assert float(probs[index == got].sum()) > 0
    with pytest.raises(ValueError, match="no probability mass"):
        ext.sample_sparse(torch.tensor([3, 1]), torch.zeros(2), 0.5)


@needs_kernels
@pytest.mark.parametrize("restricted", [False, True])
@pytest.mark.parametrize("feed", [1, 2])
def test_fused_draft_chain_draws_what_the_steps_draw(restricted, feed, monkeypatch):
    """``CachedModel.fused_chain`` (one kernel call for the whole chain) against the chain drawn step by
    step (forward_sparse + sample_sparse): the same tokens, the same q rows bit for bit, the same cache
    contents and length, the same generator state afterwards; 1 or 2 tokens fed first (2 after a fully
    accepted block), a restricted head whose map is not sorted."""

    def make():
        model = bf16_model(3, vocab=64, hidden=128, heads=2, kv_heads=1, layers=2)
        if restricted:
            model = restrict_head(model, [40, 2, 33, 7, 11, 60, 5, 19, 23, 50, 1, 0, 63, 9])
        return CachedModel(model, vocab_size=64)

    warper = Warper(temperature=0.8, top_k=6, top_p=0.9)
    runs, calls = {}, []
    for fused in (True, False):
        if fused:
            original = LeanForward.fused_chain
            monkeypatch.setattr(LeanForward, "fused_chain", lambda self, *a: calls.append(1) or original(self, *a))
        else:
            monkeypatch.setattr(CachedModel, "fused_chain", lambda self, *a: None)
        draft, out = make(), []
        with torch.inference_mode():
            for seed in range(25):
                draft.reset()
                context = [1, 2, 3, 4, 5 + seed % 7, 9][: 4 + feed]
                draft.prefill(context[:-feed])
                gen = make_generator(seed)
                chain = ModelDrafter(draft).propose(context, 3, warper, gen)
                k_cache = draft.cache.layers[0].keys.clone()
                out.append(
                    (
                        chain.tokens.tolist(),
                        chain.probs,
                        draft.length,
                        draft.forwards,
                        k_cache,
                        torch.rand(1, generator=gen),
                    )
                )
        runs[fused] = out
        monkeypatch.undo()
    for a, b in zip(runs[True], runs[False]):
        assert a[0] == b[0] and a[2:4] == b[2:4]
        assert torch.equal(a[1], b[1]) and torch.equal(a[4], b[4]) and torch.equal(a[5], b[5])
    assert len(calls) == 25  # the fused run took the kernel path
    assert len({tuple(t[0]) for t in runs[True]}) > 5  # the draws vary with the seed


@needs_kernels
def test_kernel_exp_is_within_two_ulp_of_exp():
    """The softmax and SiLU use the kernels' vectorised exp: check it against float64 over float32's range."""
    x = torch.linspace(-100.0, 88.0, 400_001)
    got = cpu_kernels.kernels().exp(x).double()
    ref = torch.exp(x.double())
    ulp = torch.nextafter(ref.float(), torch.tensor(float("inf"))).double() - ref.float().double()
    normal = ref > torch.finfo(torch.float32).tiny
    assert float(((got - ref).abs() / ulp)[normal].max()) <= 2.0
    assert cpu_kernels.kernels().exp(torch.tensor([-200.0, 0.0, 100.0])).tolist() == [0.0, 1.0, float("inf")]


@needs_kernels
@pytest.mark.parametrize("shape", SHAPES, ids=["d16", "d64", "d128"])
def test_verification_rows_equal_the_one_token_steps_bit_for_bit(shape):
    model = bf16_model(5, vocab=64, layers=3, **shape)
    ids = torch.randint(0, 64, (30,), generator=torch.Generator().manual_seed(1)).tolist()
    with torch.no_grad():
        block = CachedModel(model)
        block.prefill(ids[:10])
        rows = block.forward(ids[10:18], keep=8)
        steps = CachedModel(model)
        steps.prefill(ids[:10])
        one = torch.cat([steps.forward([t], keep=1) for t in ids[10:18]])
        assert torch.equal(rows, one)
        # and after a rollback (rejected drafts), the rewritten slots give the same rows again
        block.rollback(13)
        again = block.forward(ids[13:18], keep=5)
        assert torch.equal(again, one[3:])


@needs_kernels
@pytest.mark.parametrize("shape", [{"hidden": 32, "heads": 2, "kv_heads": 1}, *SHAPES[1:]], ids=["d16", "d64", "d128"])
def test_tree_forward_rows_equal_their_paths_as_chains(shape):
    """A tree verification (mask over the nodes) gives each node the logits of its path as a chain."""
    model = bf16_model(6, vocab=32, layers=2, **shape)
    prompt = [1, 2, 3, 4] * 9  # 36 keys: more than two 16-key chunks of the vector softmax
    # root 5 with children 6 and 7; 7 has child 8: paths 5-6 and 5-7-8
    tokens = torch.tensor([5, 6, 7, 8])
    parents = [-1, 0, 0, 2]
    depth = torch.tensor([0, 1, 1, 2])
    mask = torch.zeros(4, 4, dtype=torch.bool)
    for i in range(4):
        j = i
        while j >= 0:
            mask[i, j] = True
            j = parents[j]
    with torch.no_grad():
        cm = CachedModel(model)
        cm.prefill(prompt)
        tree = cm.forward_tree(tokens, depth + len(prompt), mask, tree_start=len(prompt))
        for node, path in [(1, [5, 6]), (3, [5, 7, 8]), (2, [5, 7])]:
            chain = CachedModel(model)
            chain.prefill(prompt)
            assert torch.equal(chain.forward(path, keep=1)[-1], tree[node])


@needs_kernels
@pytest.mark.parametrize(
    "method, params",
    [
        ("spd", {"gamma": 3}),
        ("block", {"gamma": 4}),
        ("mtad", {"gamma": 3, "tau": 0.5}),
        ("specinfer", {"k_config": [3, 2, 2]}),
        ("spectr", {"gamma": 3, "num_drafts": 3}),
    ],
)
def test_greedy_methods_equal_greedy_ar_in_bf16(method, params):
    target, draft = (
        bf16_model(0, vocab=64, hidden=64, heads=4, kv_heads=2, layers=2),
        bf16_model(1, vocab=64, hidden=32, layers=1),
    )
    prompt = [1, 5, 9, 2]
    ref = build_decoder("ar", target, temperature=0).generate(prompt, max_new_tokens=40).tokens
    got = build_decoder(method, target, draft, temperature=0, **params).generate(prompt, max_new_tokens=40).tokens
    assert got == ref


@needs_kernels
@pytest.mark.parametrize("method, params", [("ar", {}), ("spd", {"gamma": 2}), ("block", {"gamma": 3})])
def test_lossless_methods_sample_the_engines_bf16_law(method, params):
    target, draft = bf16_model(0), bf16_model(1)
    warper = Warper(**WARP)
    law = exact_law(target, PROMPT, 2, warper, engine=True)
    decoder = build_decoder(method, target, draft if method != "ar" else None, **WARP, **params)
    samples = first_tokens(decoder, 2500, 2, max_new=4, batch_size=1)  # one generate at a time: the batch-1 law itself
    assert chi_square_pvalue(samples, law) > 1e-3


def test_auto_dtype_follows_the_cpu_capability(monkeypatch):
    # a CPU that has the capability (whatever this machine has), turned off by the override
    monkeypatch.setattr(cpu_kernels, "_cpu_flags", lambda: frozenset({"avx512_bf16", "avx512f"}))
    monkeypatch.setenv("PIPELINE_CPU_BF16", "0")
    assert cpu_kernels.resolve_dtype("auto", "cpu") == "float32"
    assert cpu_kernels.kernels() is None and "PIPELINE_CPU_BF16=0" in cpu_kernels.kernels_unavailable_reason()
    spec = PairSpec.from_config({"name": "t", "target": {"id": "t"}, "draft": {"id": "d", "dtype": "bfloat16"}})
    assert spec.resolved_dtypes() == {"target": "float32", "draft": "bfloat16"}
    info = spec.precision()
    assert (
        info["cpu_bf16"] is False and info["target_dtype"] == "float32" and info["target_kernels"] == "fp32-fast-matmul"
    )
    assert info["draft_kernels"] == "bf16-onednn"  # bf16 by name still runs, through oneDNN
    monkeypatch.setenv("PIPELINE_CPU_BF16", "1")
    assert cpu_kernels.resolve_dtype("auto", "cpu") == "bfloat16"
    assert cpu_kernels.resolve_dtype("float32", "cpu") == "float32"  # a name is kept
    assert cpu_kernels.resolve_dtype("auto", "cuda") in ("bfloat16", "float32")


def test_without_native_bf16_auto_models_load_in_float32_on_todays_kernels(monkeypatch):
    monkeypatch.setenv("PIPELINE_CPU_BF16", "0")
    config = {
        "model_type": "llama",
        "vocab_size": 16,
        "hidden_size": 16,
        "intermediate_size": 32,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
    }
    spec = ModelSpec.from_config({"id": "r", "random_init": True, "config": config, "tokenizer": "x"})
    model = load_model(spec, "auto", "cpu")
    assert next(model.parameters()).dtype == torch.float32
    assert model_kernel_path(model) == "fp32-fast-matmul"


def test_bf16_without_the_kernels_goes_through_onednn_and_agrees(monkeypatch):
    model = bf16_model(2, vocab=40, hidden=64, heads=4, kv_heads=2, layers=2)
    ids = list(range(1, 15))
    monkeypatch.setenv("PIPELINE_BF16_KERNELS", "0")
    lean = LeanForward(model)
    assert lean.kernels is None and lean.kernel_path == "bf16-onednn"
    monkeypatch.delenv("PIPELINE_BF16_KERNELS")
    with torch.no_grad():
        ref = model(torch.tensor([ids])).logits[0, -1].float()
        cm = CachedModel(model)
        got = cm.forward(ids, keep=1)[-1]
    assert (got - ref).abs().max() <= 0.05 * ref.abs().max()


def test_a_bad_model_dtype_fails_with_the_choices():
    with pytest.raises(ValueError, match="unknown dtype 'half-ish'"):
        ModelSpec.from_config({"id": "m", "dtype": "half-ish"})
    with pytest.raises(ValueError, match="unknown dtype"):
        PairSpec.from_config({"name": "p", "target": {"id": "t"}, "dtype": "int3"})


@needs_kernels
@pytest.mark.parametrize("rope", [None, {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}])
def test_rotary_table_rows_equal_the_modules_own_rows(rope):
    """The kernels' cos/sin come from a table the model's rotary module computed once: each row is the
    module's own row for that position (so steps, verifications and transformers see the same rotation)."""
    extra = {} if rope is None else {"rope_parameters": rope}
    model = bf16_model(7, vocab=32, hidden=128, heads=2, kv_heads=1, layers=1, max_positions=4096, **extra)
    lean = CachedModel(model).lean
    for positions in ([0], [5, 6, 7, 8], [3000], list(range(700, 713)), [9, 4, 4, 10]):
        x = torch.zeros(len(positions), 128, dtype=torch.bfloat16)
        pos = torch.tensor([positions])
        ref_cos, ref_sin = lean._rotary[0](x[None], pos)
        cos, sin = lean._rotary_rows(x, pos, 0)  # explicit positions (trees)
        assert torch.equal(cos, ref_cos[0]) and torch.equal(sin, ref_sin[0])
        if positions == list(
            range(positions[0], positions[0] + len(positions))
        ):  # a causal chain: a slice of the table
            cos, sin = lean._rotary_rows(x, None, positions[0])
            assert torch.equal(cos, ref_cos[0]) and torch.equal(sin, ref_sin[0])


@pytest.mark.parametrize(
    "flags, dtype, path",
    [
        ({"avx512_bf16", "avx512f", "avx2", "fma"}, "bfloat16", "bf16-avx512"),
        ({"avx2", "fma"}, "bfloat16", "bf16-avx2"),  # the AVX2 build: bf16 widened in registers
        ({"avx2"}, "float32", "fp32-fast-matmul"),  # no FMA: no kernels, auto stays float32
        (set(), "float32", "fp32-fast-matmul"),
    ],
)
def test_auto_dtype_and_predicted_path_follow_the_instruction_set(monkeypatch, flags, dtype, path):
    for name in ("PIPELINE_CPU_BF16", "PIPELINE_BF16_KERNELS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(cpu_kernels, "_cpu_flags", lambda: frozenset(flags))
    assert cpu_kernels.resolve_dtype("auto", "cpu") == dtype
    assert cpu_kernels.kernel_path("cpu", dtype, build=False) == path
    # a model that never runs on the kernels (a local judge's generate): bf16 only where it is native
    native = "bfloat16" if "avx512_bf16" in flags else "float32"
    assert cpu_kernels.resolve_dtype("auto", "cpu", kernels=False) == native
    assert cpu_kernels.resolve_dtype("bfloat16", "cpu", kernels=False) == "bfloat16"  # a name passes through
    if dtype == "bfloat16":  # the kernels' switch off: an AVX2 CPU keeps float32 rather than bf16 through oneDNN
        monkeypatch.setenv("PIPELINE_BF16_KERNELS", "0")
        assert cpu_kernels.resolve_dtype("auto", "cpu") == ("bfloat16" if "avx512_bf16" in flags else "float32")
        assert cpu_kernels.kernel_path("cpu", "bfloat16", build=False) == "bf16-onednn"


def test_the_kernels_are_built_for_the_machine_not_the_flags_a_test_patches():
    """``_build`` compiles for ``/proc/cpuinfo``'s instruction set, so a test that sees this machine as another
    CPU never runs code this CPU lacks; a model on the kernels names the build it runs."""
    if not HAS_KERNELS:
        pytest.skip(kernels_reason())
    machine = cpu_kernels._isa_of(cpu_kernels._machine_flags())
    assert cpu_kernels.kernels_isa() == machine
    cm = CachedModel(bf16_model(0))
    assert cm.lean is not None and cm.lean.kernel_path == f"bf16-{machine}"


# ---------------------------------------------------------------------------------------------------
# The build lock dies with its holder (issue 47)
# ---------------------------------------------------------------------------------------------------

_HOLDER = """
import sys, time
from pathlib import Path
from pipeline.decoding.cpu_kernels import build_lock
with build_lock(Path(sys.argv[1]), wait_s=5):
    Path(sys.argv[1], "lock").write_text("")  # torch's baton, as cpp_extension.load makes it mid-build
    print("held", flush=True)
    time.sleep(120)
"""


def _hold_lock(folder):
    import subprocess  # noqa: PLC0415
    import sys  # noqa: PLC0415

    proc = subprocess.Popen([sys.executable, "-c", _HOLDER, str(folder)], stdout=subprocess.PIPE, text=True, cwd=REPO)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    return proc


def test_a_killed_builder_does_not_block_the_next_build(tmp_path, capsys):
    """A process that holds the build lock is SIGKILLed mid-build: the next build takes the lock at once, and the
    torch baton the dead build left is removed (torch's own FileBaton would wait for it forever)."""
    import signal  # noqa: PLC0415
    import time  # noqa: PLC0415

    proc = _hold_lock(tmp_path)
    try:
        # while its holder lives, the lock holds: a short wait ends in a TimeoutError naming the holder
        with pytest.raises(TimeoutError, match=f"held by pid {proc.pid}"):
            with cpu_kernels.build_lock(tmp_path, wait_s=0.3, notice_s=0.1):
                pass
        assert "longer than a build takes" in capsys.readouterr().err  # the wait said so
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert (tmp_path / "lock").exists()  # the dead build's baton is still there
    start = time.monotonic()
    built = []
    with cpu_kernels.build_lock(tmp_path, stale=("lock",), wait_s=5):
        built.append(not (tmp_path / "lock").exists())
    assert built == [True] and time.monotonic() - start < 2
    assert "left by a build that was killed" in capsys.readouterr().err


def test_the_real_build_runs_under_the_lock_past_a_stale_torch_baton(tmp_path, monkeypatch):
    """``_build`` (what ``kernels()`` calls) loads the extension inside ``build_lock`` and a torch ``lock`` baton
    left by an older killed build does not hang it: torch's FileBaton must be free when ``load`` runs."""
    import fcntl  # noqa: PLC0415
    import os  # noqa: PLC0415

    from torch.utils import cpp_extension  # noqa: PLC0415
    from torch.utils.file_baton import FileBaton  # noqa: PLC0415

    isa = cpu_kernels._isa_of(cpu_kernels._machine_flags())
    if isa is None:
        pytest.skip("this CPU cannot build the kernels")
    monkeypatch.setenv("PIPELINE_CACHE", str(tmp_path))
    monkeypatch.setattr(cpu_kernels, "_STATE", {})
    seen = {}
    folder = tmp_path / "torch_extensions" / "this-build"

    def folder_of(root, isa_, cflags):
        seen["folder"] = cpu_kernels.build_folder(root, isa_, cflags)  # the folder these sources would use
        return folder

    monkeypatch.setattr(cpu_kernels, "_build_folder", folder_of)
    folder.mkdir(parents=True)
    (folder / "lock").write_text("")  # an older build killed mid-compile

    def fake_load(build_directory, name, **_):
        shutil.copy(os.path.realpath(sys.executable), os.path.join(build_directory, f"{name}.so"))  # a whole ELF
        baton = FileBaton(os.path.join(build_directory, "lock"))
        seen["baton_free"] = baton.try_acquire()  # torch's load would wait forever on a stale baton
        baton.release()
        fd = os.open(os.path.join(build_directory, "build.flock"), os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            seen["flock_held"] = False
        except BlockingIOError:
            seen["flock_held"] = True
        finally:
            os.close(fd)
        return "module"

    monkeypatch.setattr(cpp_extension, "load", fake_load)
    assert cpu_kernels._build() == "module"
    assert seen.pop("folder").parent == tmp_path / "torch_extensions"
    assert seen == {"baton_free": True, "flock_held": True}
    # one folder per source and flags: another checkout's sources or flags never share (nor rebuild) it
    root = tmp_path / "x"
    assert cpu_kernels.build_folder(root, isa, ["-O3"]) != cpu_kernels.build_folder(root, isa, ["-O2"])
    # the lock went with the build: the next one takes it at once
    with cpu_kernels.build_lock(folder, wait_s=1):
        pass


def test_a_finished_build_is_imported_from_another_checkout_without_ninja(tmp_path, monkeypatch):
    """The build folder names everything the library depends on (sources, flags, torch, Python), so another
    checkout or virtual environment (whose ninja file would name other paths and rebuild) imports the finished
    library as it is: no `cpp_extension.load`, no lock; a folder without the BUILT mark is built (and marked)."""
    from torch.utils import cpp_extension  # noqa: PLC0415

    module = cpu_kernels.kernels()
    if module is None:
        pytest.skip(kernels_reason())
    isa = cpu_kernels._STATE["isa"]
    name = f"pipeline_bf16_decoder_{isa}"
    folder = tmp_path / "torch_extensions" / "finished"
    folder.mkdir(parents=True)
    shutil.copy(module.__file__, folder / f"{name}.so")
    monkeypatch.setenv("PIPELINE_CACHE", str(tmp_path))
    monkeypatch.setattr(cpu_kernels, "_STATE", {})
    monkeypatch.setattr(cpu_kernels, "_build_folder", lambda root, isa_, cflags: folder)
    calls = []

    def fake_load(build_directory, **_):
        calls.append(build_directory)
        return "built"

    monkeypatch.setattr(cpp_extension, "load", fake_load)
    assert cpu_kernels._build() == "built" and calls == [str(folder)]  # no mark: built, then marked
    assert (folder / cpu_kernels.BUILT).exists()
    again = cpu_kernels._build()  # marked: imported as it is
    assert calls == [str(folder)] and again.__name__ == name and hasattr(again, "decoder_forward")
    # the name of the folder carries the torch and Python versions (another ABI: another folder)
    real = cpu_kernels.build_folder(tmp_path, isa, ["-O3"])
    assert torch.__version__.replace("+", "_") in real.name and sys.implementation.cache_tag in real.name


# ---------------------------------------------------------------------------------------------------
# A shared build cache is untrusted (issue 57): links, truncated and corrupt libraries
# ---------------------------------------------------------------------------------------------------


def test_a_symlinked_lock_file_is_refused_and_its_target_untouched(tmp_path):
    """build_lock wrote its pid through a planted ``build.flock -> <file>`` (the GGUF lock too: the same code)."""
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    folder = tmp_path / "build"
    folder.mkdir()
    (folder / "build.flock").symlink_to(victim)
    with pytest.raises(OSError, match=r"is a symbolic link, not a lock file: remove it \(rm "):
        with cpu_kernels.build_lock(folder, wait_s=1):
            pass
    assert victim.read_text() == "precious\n"


def _real_library():
    module = cpu_kernels.kernels()
    if module is None:
        pytest.skip(f"no kernels here: {cpu_kernels.kernels_unavailable_reason()}")
    return module, f"pipeline_bf16_decoder_{cpu_kernels._STATE['isa']}"


@pytest.mark.parametrize("damage", ["truncated", "corrupt", "truncated-old-mark"])
def test_a_damaged_marked_library_is_rebuilt_not_loaded(tmp_path, monkeypatch, damage):
    """A truncated library with its mark killed every process that mapped it (SIGBUS); a corrupt one failed to
    import and left the engine on oneDNN for good. The mark now records the library's size and sha256 (and marks
    before it get a whole-ELF check): a damaged library is not taken as built, and the builder removes it and
    builds again under the lock."""
    from torch.utils import cpp_extension  # noqa: PLC0415

    module, name = _real_library()
    good = Path(module.__file__).read_bytes()
    folder = tmp_path / "torch_extensions" / "shared"
    folder.mkdir(parents=True)
    library = folder / f"{name}.so"
    library.write_bytes(good)
    cpu_kernels._mark_built(folder, name)
    assert cpu_kernels._built_library(folder, name) == library
    if damage == "corrupt":  # same size, other bytes in the middle
        middle = len(good) // 2
        library.write_bytes(good[:middle] + bytes(64) + good[middle + 64 :])
    else:
        library.write_bytes(good[: len(good) * 3 // 4])
    if damage == "truncated-old-mark":
        (folder / cpu_kernels.BUILT).write_text(f"{sys.executable}\n")  # a mark written before issue 57
    assert cpu_kernels._built_library(folder, name) is None
    monkeypatch.setenv("PIPELINE_CACHE", str(tmp_path))
    monkeypatch.setattr(cpu_kernels, "_STATE", {})
    monkeypatch.setattr(cpu_kernels, "_build_folder", lambda root, isa_, cflags: folder)
    seen = []

    def fake_load(build_directory, **_):  # ninja links anew only when the damaged library is gone
        seen.append(library.exists())
        library.write_bytes(good)
        return "rebuilt"

    monkeypatch.setattr(cpp_extension, "load", fake_load)
    assert cpu_kernels._build() == "rebuilt" and seen == [False]
    assert cpu_kernels._built_library(folder, name) == library  # marked again, with the new library's digest


def test_the_mark_is_a_new_file_never_written_through_a_link(tmp_path):
    module, name = _real_library()
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    folder = tmp_path / "build"
    folder.mkdir()
    shutil.copy(module.__file__, folder / f"{name}.so")
    (folder / cpu_kernels.BUILT).symlink_to(victim)
    assert cpu_kernels._built_library(folder, name) is None  # a linked mark is no mark
    cpu_kernels._mark_built(folder, name)
    assert victim.read_text() == "precious\n" and not (folder / cpu_kernels.BUILT).is_symlink()
    assert cpu_kernels._built_library(folder, name) == folder / f"{name}.so"
