"""A multi-node Ray cluster on this machine (ray.cluster_utils.Cluster): cells spread across nodes."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import ray
from ray.cluster_utils import Cluster

from helpers.project import make_project, run_sweep


@pytest.fixture(scope="module")
def two_nodes():
    if ray.is_initialized():
        ray.shutdown()
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    cluster.add_node(num_cpus=1)
    cluster.wait_for_nodes()
    yield cluster
    ray.shutdown()
    cluster.shutdown()


@pytest.mark.slow  # a two-node Ray cluster on this machine: ~100 s here, opt-in (make test-slow)
def test_cells_spread_across_nodes(two_nodes, tmp_path):
    root = make_project(tmp_path)
    out = run_sweep(
        root,
        "cluster=ray",
        f"cluster.address={two_nodes.address}",
        "cluster.cpus_per_cell=1",
        "cluster.scheduling_strategy=SPREAD",
        "cluster.runtime_env.env_vars={}",
        "sweep.datasets=[{dataset: humaneval, limit: 1, max_new_tokens: 4}]",
        "seeds=[0,1]",
    )
    assert out["finished"] == 6 and out["failed"] == 0, out["results"]
    assert not ray.is_initialized()  # the sweep joined the cluster by address and left it
    nodes = {r["node_id"] for r in out["rows"]}
    cluster_nodes = {n.node_id for n in two_nodes.list_all_nodes()}
    assert len(cluster_nodes) == 2 and nodes == cluster_nodes  # both nodes ran cells, results from both


def test_a_local_sweep_starts_its_own_ray_beside_a_running_cluster(two_nodes):
    """cluster=local never joins another Ray instance on the machine (ray.init() without an address joins
    the newest `ray start` cluster it finds and then refuses num_cpus: a sweep failed so beside this test)."""
    code = (
        "import ray; from pipeline.sweep.ray_runner import start_ray; "
        "assert start_ray({'kind': 'local', 'num_cpus': 1}); print(int(ray.cluster_resources()['CPU'])); ray.shutdown()"
    )
    env = {**os.environ, "RAY_ADDRESS": two_nodes.address}  # the strongest pull towards the running cluster
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().splitlines()[-1] == "1"  # its own one-CPU instance, not the two-node cluster
