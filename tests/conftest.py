"""Shared fixtures: a tiny random pair (tests/helpers/models.py), the offline data folder, a local Ray session."""

from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # before transformers / huggingface_hub are imported
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import logging  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

from helpers import file_costs, warm_caches  # noqa: E402
from helpers.models import tiny_llama  # noqa: E402
from helpers.paths import DATA  # noqa: E402
from pipeline.decoding import cpu_kernels  # noqa: E402
from pipeline.decoding.medusa_heads import MedusaHeads, place_medusa_heads  # noqa: E402

# Tiny models gain nothing from intra-op threads, and oversubscribed threads slow CPUs badly.
torch.set_num_threads(1)

WARMING = pytest.StashKey[list]()  # the controller's background cache builds (helpers/warm_caches.py)


def pytest_configure(config):
    """xdist's work queue in our collection order (below), not re-sorted by each file's number of tests; in xdist's
    controller, what the cache folder lacks (the bf16 kernels, the offline target's GGUF copy) is started in the
    background while the workers collect (helpers/warm_caches.py)."""
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False
    if not hasattr(config, "workerinput") and (getattr(config.option, "numprocesses", None) or 0) != 0:
        config.stash[WARMING] = warm_caches.start(warm_caches.missing(), Path(config.rootpath) / ".pytest_cache")


def pytest_unconfigure(config):
    """The background builds end with the session (they are done long before; a failed one is reported: the tests
    that needed it met the same failure; one still blocked on another process's lock is stopped after
    ``warm_caches.END_WAIT_S``, not waited for)."""
    for note in warm_caches.finish(config.stash.get(WARMING, [])):
        print(f"\n{note}", file=sys.stderr)


def pytest_collection_modifyitems(config, items):
    """The costliest test files first (tests/file_costs.json; helpers/file_costs.py says why)."""
    items[:] = file_costs.ordered(items, lambda item: item.nodeid.split("::", 1)[0], file_costs.load())


@pytest.fixture(scope="session")
def tiny_pair():
    """(target, draft): two different random models over the same 8-token vocabulary (with ``tiny_assets``, every
    registered method can be built over this pair)."""
    return tiny_llama(0), tiny_llama(1)


@pytest.fixture(scope="session")
def tiny_assets(tiny_pair):
    """What a pair with a ``medusa:`` key passes beside its models (``LoadedPair.assets``): (untrained) Medusa heads
    for ``tiny_pair``'s target, never set on the model."""
    return {"medusa": place_medusa_heads(tiny_pair[0], MedusaHeads(tiny_pair[0].config.hidden_size, 2))}


@pytest.fixture
def bf16_cpu(monkeypatch):
    """This machine seen as a CPU with AVX512_BF16 and no overrides: cell keys hold the planner's precision
    (resolved dtypes, kernel paths, the CPU's capability), so key pins fix the capability they were made under."""
    for name in ("PIPELINE_CPU_BF16", "PIPELINE_BF16_KERNELS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(cpu_kernels, "_cpu_flags", lambda: frozenset({"avx512_bf16", "avx512f"}))


@pytest.fixture(scope="session")
def data_root() -> Path:
    """The project's data/ folder (part of the repository: a missing file is a failure, never a skip)."""
    return DATA  # the project's own offline copy of the evaluation data (data/README.md)


@pytest.fixture(scope="module")
def ray_session():
    """A local 2-CPU Ray session shared by the sweep tests of one module (each test has its own project)."""
    import ray  # noqa: PLC0415 - here, not at the top: a GPU node without Ray still runs the CUDA and energy tests

    if ray.is_initialized():
        ray.shutdown()
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        logging_level=logging.ERROR,
        object_store_memory=100_000_000,
    )
    yield
    ray.shutdown()
