"""NUMA topology for tensor-parallel ranks: cpulists, a faked sysfs tree
($ARMLLM_SYSFS), each rank's CPU set by node or by hand (--cpus), and binding
a process's CPUs and memory (set_mempolicy) seen in /proc."""
from __future__ import annotations

import subprocess
import sys

import pytest

from armllm.engine.topology import (
    Node,
    claim_cpus,
    format_cpulist,
    numa_nodes,
    parse_cpulist,
    rank_cpus,
)


def test_parse_cpulist():
    assert parse_cpulist("0-3,8,10-11\n") == (0, 1, 2, 3, 8, 10, 11)
    assert parse_cpulist("5") == (5,)
    assert format_cpulist((0, 1, 2, 3, 8, 10, 11)) == "0-3,8,10-11"
    for bad in ("3-1", "a", "1,1", "-2"):
        with pytest.raises(ValueError, match="CPU list"):
            parse_cpulist(bad)


def fake_sysfs(root, nodes: dict[int, str]):
    for node, cpulist in nodes.items():
        d = root / "devices/system/node" / f"node{node}"
        d.mkdir(parents=True)
        (d / "cpulist").write_text(cpulist + "\n")
    (root / "devices/system/node/possible").write_text("0-3\n")  # not a node directory
    return root


def test_nodes_from_a_faked_sysfs(tmp_path, monkeypatch):
    monkeypatch.setenv("ARMLLM_SYSFS", str(fake_sysfs(tmp_path, {0: "0-47", 1: "48-95",
                                                                 2: ""})))
    nodes = numa_nodes()   # a node without CPUs (memory only) is no rank's
    assert nodes == [Node(0, tuple(range(48))), Node(1, tuple(range(48, 96)))]
    assert rank_cpus(2) == [tuple(range(48)), tuple(range(48, 96))]
    assert rank_cpus(1) == [tuple(range(96))]
    info = subprocess.run([sys.executable, "-m", "armllm", "info"], capture_output=True,
                          text=True, timeout=120)
    assert "numa nodes:  node 0: CPUs 0-47; node 1: CPUs 48-95" in info.stdout, info.stderr
    four = rank_cpus(4)      # two ranks per node, each half of it
    assert four == [tuple(range(24)), tuple(range(24, 48)), tuple(range(48, 72)),
                    tuple(range(72, 96))]


# CPU ids far above this machine's: claims must not meet a Ray test's or a user's
FAR = 4000
HOLDER = f"""
import sys, time
from armllm.engine.topology import Node, claim_cpus
claim = claim_cpus(int(sys.argv[1]), [Node(0, tuple(range({FAR}, {FAR + 4})))])
print(claim.cpus if claim else None, flush=True)
time.sleep(60)
"""


def test_claimed_cpus_are_no_other_process_s_until_it_exits():
    """claim_cpus gives each process CPUs no other holds: a node's lowest free ones,
    the next node's where one lacks that many, None where no node has them; a
    holder's CPUs are free again once it exits, however it exits."""
    nodes = [Node(0, tuple(range(FAR, FAR + 4))), Node(1, tuple(range(FAR + 4, FAR + 8)))]
    other = subprocess.Popen([sys.executable, "-c", HOLDER, "3"], stdout=subprocess.PIPE,
                             text=True)
    try:
        assert other.stdout.readline().strip() == str((FAR, FAR + 1, FAR + 2))
        # node 0 has one CPU left: two come from node 1, the lone one stays free
        two = claim_cpus(2, nodes)
        assert (two.cpus, two.node) == ((FAR + 4, FAR + 5), 1)
        one = claim_cpus(1, nodes)
        assert (one.cpus, one.node) == ((FAR + 3,), 0)
        assert claim_cpus(3, nodes) is None          # node 1 has 2 free, node 0 none
        two.release()
        again = claim_cpus(3, nodes)
        assert again.cpus == (FAR + 4, FAR + 5, FAR + 6)
        with pytest.raises(ValueError, match="CPUs to claim must be >= 1, got 0"):
            claim_cpus(0, nodes)
    finally:
        other.kill()
        other.wait()
    whole = claim_cpus(3, nodes)                     # the killed holder's CPUs are free
    assert whole.cpus == (FAR, FAR + 1, FAR + 2)
    for claim in (one, again, whole):
        claim.release()


def test_this_machine_without_a_fake(monkeypatch):
    monkeypatch.delenv("ARMLLM_SYSFS", raising=False)
    nodes = numa_nodes()
    allowed = set(__import__("os").sched_getaffinity(0))
    assert nodes and all(set(n.cpus) <= allowed for n in nodes)
    assert set().union(*(n.cpus for n in nodes)) == allowed


def test_more_ranks_than_cpus_share_them():
    # three ranks on two CPUs: every rank gets one, the CPUs are all used
    assert rank_cpus(3, nodes=[Node(0, (0, 1))]) == [(0,), (0,), (1,)]


def test_cpus_by_hand():
    assert rank_cpus(2, "0-1|2-3") == [(0, 1), (2, 3)]
    with pytest.raises(ValueError, match="names 3 CPU sets for 2 ranks"):
        rank_cpus(2, "0|1|2")
    with pytest.raises(ValueError, match="gives a CPU to two ranks"):
        rank_cpus(2, "0-1|1-2")
    with pytest.raises(ValueError, match="empty CPU set"):
        rank_cpus(2, "0-1|")


def test_bind_sets_affinity_and_memory_policy():
    """In a child process: CPU 0 only, memory bound to node 0 (set_mempolicy),
    as /proc shows them."""
    code = ("from armllm.engine.topology import bind; bind((0,), [0]); "
            "import re; s = open('/proc/self/status').read(); "
            "print(re.search(r'Cpus_allowed_list:\\s*(\\S+)', s).group(1)); "
            "print(any(' bind:0' in l for l in open('/proc/self/numa_maps')))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["0", "True"]
