"""topology: the machine's NUMA nodes, the CPUs and the memory each
tensor-parallel rank (a process) gets, and binding a process to them.

Nodes are read from sysfs (node*/cpulist under /sys/devices/system/node), or
from the tree $ARMLLM_SYSFS names (tests fake a topology there). A rank's CPU
set is, by default, one node's CPUs; `--cpus "0-47|48-95"` gives each rank its
own by hand (vLLM's VLLM_CPU_OMP_THREADS_BIND). Binding sets the process's CPU
affinity (the kernel pool, started afterwards, pins its workers within it) and
its memory policy to its nodes with the set_mempolicy system call (no libnuma),
so that everything it allocates afterwards, its weight shard and KV cache
included, lives on its own node.

Processes that Ray places (armllm.ray's replicas and batch actors) claim their
CPUs instead (claim_cpus): Ray counts a machine's CPUs but pins nothing, so
each such process takes CPUs of one node that no other has claimed."""
from __future__ import annotations

import ctypes
import errno
import os
import platform
import socket
from dataclasses import dataclass
from pathlib import Path

SYSFS = Path("/sys")
NODE_DIR = "devices/system/node"
MPOL_DEFAULT, MPOL_BIND = 0, 2  # linux/mempolicy.h
# a CPU is claimed by binding the abstract Unix socket of this name: every process of
# the machine (one network namespace) sees it, and the kernel frees it when the holder
# exits, however it exits
CPU_CLAIM = "armllm-cpu-{cpu}"
SET_MEMPOLICY = {"x86_64": 238, "aarch64": 237}   # the system call's number


@dataclass(frozen=True)
class Node:
    id: int
    cpus: tuple[int, ...]


def parse_cpulist(text: str) -> tuple[int, ...]:
    """CPU ids of a Linux cpulist such as "0-3,8,10-11"; a ValueError naming the
    text otherwise."""
    cpus: list[int] = []
    for part in text.strip().split(","):
        if not part:
            continue
        lo, sep, hi = part.partition("-")
        try:
            first, last = int(lo), int(hi) if sep else int(lo)
        except ValueError:
            raise ValueError(f"not a CPU list: {text!r}") from None
        if first < 0 or last < first:
            raise ValueError(f"not a CPU list: {text!r}")
        cpus.extend(range(first, last + 1))
    if len(set(cpus)) != len(cpus):
        raise ValueError(f"CPU list {text!r} names a CPU twice")
    return tuple(cpus)


def format_cpulist(cpus: tuple[int, ...]) -> str:
    """The cpulist of CPU ids, ranges joined: (0, 1, 2, 5) -> "0-2,5"."""
    parts, ids = [], sorted(cpus)
    i = 0
    while i < len(ids):
        j = i
        while j + 1 < len(ids) and ids[j + 1] == ids[j] + 1:
            j += 1
        parts.append(str(ids[i]) if i == j else f"{ids[i]}-{ids[j]}")
        i = j + 1
    return ",".join(parts)


def numa_nodes() -> list[Node]:
    """The NUMA nodes that have CPUs this process may run on (their CPUs limited to
    those); one node of the allowed CPUs where sysfs shows none."""
    allowed = os.sched_getaffinity(0)
    root = Path(os.environ.get("ARMLLM_SYSFS", SYSFS)) / NODE_DIR
    nodes = []
    for d in sorted(root.glob("node[0-9]*"), key=lambda p: int(p.name[4:])):
        cpulist = d / "cpulist"
        cpus = parse_cpulist(cpulist.read_text()) if cpulist.exists() else ()
        if "ARMLLM_SYSFS" not in os.environ:  # a faked tree names CPUs of its own
            cpus = tuple(c for c in cpus if c in allowed)
        if cpus:
            nodes.append(Node(int(d.name[4:]), cpus))
    return nodes or [Node(0, tuple(sorted(allowed)))]


def rank_cpus(ranks: int, cpus: str | None = None,
              nodes: list[Node] | None = None) -> list[tuple[int, ...]]:
    """Each rank's CPU set: from `cpus` ("0-47|48-95": one cpulist per rank), else
    the nodes' CPUs, one node per rank when there are as many nodes as ranks (the
    nodes dealt round-robin when there are more, each node's CPUs split when there
    are fewer). A ValueError naming the problem."""
    if ranks < 1:
        raise ValueError(f"ranks must be >= 1, got {ranks}")
    if cpus is not None:
        sets = [parse_cpulist(group) for group in cpus.split("|")]
        if len(sets) != ranks:
            raise ValueError(f"--cpus {cpus!r} names {len(sets)} CPU sets for {ranks} ranks")
        if any(not s for s in sets):
            raise ValueError(f"--cpus {cpus!r} has an empty CPU set")
        seen = [c for s in sets for c in s]
        if len(set(seen)) != len(seen):
            raise ValueError(f"--cpus {cpus!r} gives a CPU to two ranks")
        return sets
    nodes = nodes or numa_nodes()
    if len(nodes) >= ranks:
        return [tuple(c for n in nodes[r::ranks] for c in n.cpus) for r in range(ranks)]
    owner = [r * len(nodes) // ranks for r in range(ranks)]  # consecutive ranks share
    out = []
    for r, j in enumerate(owner):
        sharers = [q for q in range(ranks) if owner[q] == j]
        k, parts, node_cpus = sharers.index(r), len(sharers), nodes[j].cpus
        part = node_cpus[k * len(node_cpus) // parts:(k + 1) * len(node_cpus) // parts]
        out.append(part or (node_cpus[k % len(node_cpus)],))  # more ranks than CPUs: share
    return out


def nodes_of(cpus: tuple[int, ...], nodes: list[Node] | None = None) -> list[int]:
    """The nodes whose CPUs a CPU set uses."""
    nodes = nodes or numa_nodes()
    return [n.id for n in nodes if set(n.cpus) & set(cpus)]


def placements(ranks: int, cpus: str | None = None
               ) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    """Each rank's (CPU set, memory nodes) (see rank_cpus). Under a faked topology
    ($ARMLLM_SYSFS) the memory nodes are empty: its nodes need not exist, so only the
    CPUs are bound."""
    nodes = numa_nodes()
    sets = rank_cpus(ranks, cpus, nodes)
    faked = "ARMLLM_SYSFS" in os.environ
    return [(s, () if faked else tuple(nodes_of(s, nodes))) for s in sets]


@dataclass
class CpuClaim:
    """CPUs of one node held for this process until release() or its exit."""
    cpus: tuple[int, ...]
    node: int
    sockets: list[socket.socket]

    def release(self) -> None:
        for s in self.sockets:
            s.close()
        self.sockets.clear()


def claim_cpus(count: int, nodes: list[Node] | None = None) -> CpuClaim | None:
    """`count` CPUs of one NUMA node that no other process of this machine has
    claimed (the first node with that many free, its lowest free CPUs), held for
    this process; None when no node has that many free, or off Linux (whose
    abstract sockets the claims are)."""
    if count < 1:
        raise ValueError(f"CPUs to claim must be >= 1, got {count}")
    if platform.system() != "Linux":
        return None
    for node in nodes or numa_nodes():
        held: list[tuple[int, socket.socket]] = []
        for cpu in node.cpus:
            if len(held) == count:
                break
            s = _hold(cpu)
            if s is not None:
                held.append((cpu, s))
        if len(held) == count:
            return CpuClaim(tuple(c for c, _ in held), node.id, [s for _, s in held])
        for _, s in held:
            s.close()
    return None


def _hold(cpu: int) -> socket.socket | None:
    """CPU_CLAIM's socket of `cpu`, bound (held), or None if another process holds it."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)   # not inherited by children
    try:
        s.bind("\0" + CPU_CLAIM.format(cpu=cpu))
    except OSError as exc:
        s.close()
        if exc.errno == errno.EADDRINUSE:
            return None
        raise
    return s


def bind(cpus: tuple[int, ...], node_ids: list[int]) -> None:
    """Runs the calling thread, and the threads it starts afterwards (the kernel pool
    must start after this), on `cpus`, and allocates their memory from `node_ids`
    (none: the policy is left as it is)."""
    os.sched_setaffinity(0, cpus)
    if node_ids:
        set_memory_nodes(node_ids)


def unbind(cpus: tuple[int, ...]) -> None:
    """Undoes bind() on the calling thread: runs it on `cpus` again (what
    os.sched_getaffinity(0) gave before), memory from any node."""
    os.sched_setaffinity(0, cpus)
    number = SET_MEMPOLICY.get(platform.machine())
    if number is not None:
        ctypes.CDLL(None, use_errno=True).syscall(number, MPOL_DEFAULT, None, ctypes.c_ulong(0))


def set_memory_nodes(node_ids: list[int]) -> None:
    """set_mempolicy(MPOL_BIND, the nodes' mask); an OSError naming the nodes."""
    number = SET_MEMPOLICY.get(platform.machine())
    if number is None:
        raise OSError(f"binding memory to NUMA nodes is not supported on "
                      f"{platform.machine()}")
    if not node_ids:
        raise ValueError("no NUMA node to bind memory to")
    bits = 64
    words = max(node_ids) // bits + 1
    mask = (ctypes.c_ulong * words)()
    for n in node_ids:
        mask[n // bits] |= 1 << (n % bits)
    libc = ctypes.CDLL(None, use_errno=True)
    # maxnode counts bits; the kernel reads maxnode - 1 of them
    if libc.syscall(number, MPOL_BIND, mask, ctypes.c_ulong(words * bits + 1)) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"set_mempolicy(MPOL_BIND, nodes {node_ids}): {os.strerror(err)}")
