"""tp_worker: a tensor-parallel rank other than 0, as its own process
(`python -m armllm.engine.tp_worker FD`, spawned by engine/tensor_parallel.py's
RankGroup with FD its control socket).

It binds itself to its CPUs and NUMA nodes, maps the shared segment, loads its
shard of the model, builds its share of the KV cache once rank 0 has sized it,
then runs each step rank 0 broadcasts (with its KV block and recurrent state
slot copies) until STOP. Every message to rank 0 is a JSON line ({"state":
...} or {"error": ...}); a thread reads the socket throughout and ends the
process when rank 0 goes away (the socket closes), so a worker never outlives
its engine."""
from __future__ import annotations

import json
import logging
import os
import queue
import socket
import sys
import threading

log = logging.getLogger("armllm.tp_worker")


def _reader(f, inbox: queue.SimpleQueue) -> None:
    for line in f:
        inbox.put(json.loads(line))
    os._exit(1)   # rank 0 is gone (or shut us down mid-startup)


def run(fd: int) -> int:
    sock = socket.socket(fileno=fd)
    f = sock.makefile("rw", encoding="utf-8")
    inbox: queue.SimpleQueue = queue.SimpleQueue()
    threading.Thread(target=_reader, args=(f, inbox), daemon=True).start()
    lock = threading.Lock()

    def send(message: dict) -> None:
        with lock:
            f.write(json.dumps(message) + "\n")
            f.flush()

    try:
        spec = inbox.get()
        # the engine's modules load after the binding, so that their memory is local
        from armllm import ops
        from armllm.engine import topology
        from armllm.engine.comm import AllReduce
        topology.bind(tuple(spec["cpus"]), list(spec["nodes"]))
        ops.restart_pool(spec["threads"])
        rank = spec["rank"]
        allreduce = AllReduce(spec["segment"], rank, spec["ranks"], spec["max_floats"])
        send({"state": "attached"})
        from armllm.engine.runner import ModelRunner
        from armllm.engine.tensor_parallel import StepChannel
        from armllm.model.kv_cache import KVCache
        from armllm.model.loader import load_model
        from armllm.model.quantize import parse_scheme
        quant = spec["quantization"]
        quant = quant if quant in ("auto", "none") else parse_scheme(quant)
        loaded = load_model(spec["model"], spec["dtype"], None, quant,
                            spec["quantize_lm_head"], comm=allreduce.comm,
                            score_from_tokens=spec["score_from_tokens"])
        model = loaded.model
        send({"state": "loaded"})
        cache = inbox.get()
        kv = KVCache(model.config, cache["num_blocks"], spec["block_size"],
                     spec["kv_cache_dtype"], cache["num_window_blocks"],
                     cache["state_slots"])
        bounds = model.vocab_bounds
        runner = ModelRunner(model, kv, cache["max_tokens"], cache["max_logits"],
                             cache["max_model_len"],
                             logits_cols=int(bounds[rank + 1] - bounds[rank]))
        channel = StepChannel(allreduce.comm)
        send({"state": "ready"})
    except Exception as exc:  # noqa: BLE001 - reported to rank 0, which raises it
        send({"error": f"{type(exc).__name__}: {exc}"})
        return 2
    while True:
        try:
            step = channel.receive()
        except ops.CommAborted:
            return 1   # another rank failed; rank 0 reports it
        if step is None:
            return 0
        meta, copies, state_copies = step
        try:
            runner.forward(meta, copies, state_copies)
        except ops.CommAborted:
            return 1
        except ValueError:
            # a bad batch fails the same way, at the same point, on every rank (they hold
            # the same metadata): rank 0 fails its requests, every rank goes on
            log.debug("rank %d: step failed as on every rank", rank, exc_info=True)
        except Exception as exc:  # noqa: BLE001 - this rank cannot go on
            send({"error": f"{type(exc).__name__}: {exc}"})
            return 1


def main() -> None:
    logging.basicConfig(level=logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    sys.exit(run(int(sys.argv[1])))


if __name__ == "__main__":
    main()
