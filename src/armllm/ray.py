"""ray: armllm on a Ray cluster (the optional extra: pip install "armllm[ray]").
Only this module imports Ray, and only `armllm serve --ray` imports this module,
so the default install neither needs nor loads Ray.

Serving. build_app(model, num_replicas=N, ...) is a Ray Serve application of N
replicas, each one AsyncLLM behind armllm's own Starlette app (server.app's
create_app: the routes, errors, streaming, admission and metrics of `armllm
serve`), with Ray Serve's HTTP proxy in front and its router spreading requests
over the replicas. `armllm serve --ray` runs it (run_server), and so does Ray's
own command line: `serve run armllm.ray:app_builder model=PATH num_replicas=2`.

- The model: a path every node has, or a Hugging Face Hub name, which is checked
  where the app is built (no weight fetched there) and pinned to its current
  commit; each replica downloads it into its own machine's Hugging Face cache
  (HF_HOME there), with the builder's HF_TOKEN, HF_ENDPOINT and HF_HUB_OFFLINE
  passed on in the replica's runtime environment.
- Placement: a replica reserves num_cpus = its engine's kernel threads (the
  `threads` engine argument; default: what armllm would use on the machine that
  builds the app) and runs exactly that many, so Ray puts at most
  node CPUs // threads replicas on a node. threads = a machine's CPUs gives one
  replica per machine; threads = a NUMA node's CPUs gives the layout of `armllm
  serve -dp`, one replica per NUMA node. Ray counts CPUs but pins nothing, so a
  replica claims `threads` CPUs of one NUMA node that no other armllm process of
  its machine holds (topology.claim_cpus; the lowest free of the first node with
  that many) and binds its threads and memory there, as `armllm serve -dp` binds
  a replica: replicas sharing a machine never share a CPU, and one per node stays
  on its node. Where no node has that many free CPUs the replica runs unpinned
  (a warning says so). A replica is one engine process, so data and tensor
  parallelism inside it (and --cpus) are refused. Ray Data's actors (below) claim
  their CPUs the same way.
- Routing: Ray Serve runs its HTTP proxy on every node. A proxy gives a request
  to a replica on its own node while one has room (max_num_seqs requests, the
  engine's batch, plus a few spare so that /health and /metrics get through),
  else to another replica; requests finding no room wait in the proxy's queue
  (max_waiting_requests of them; beyond, Ray answers 503) and go to the first
  replica with room. Spread clients over the nodes' proxies (a load balancer,
  or DNS); one proxy alone hands other nodes only what its own cannot take.
- /metrics: each replica answers with its own metrics, every sample labelled
  replica="<Ray replica id>". Ray's router sends each request, a scrape too, to
  one replica, so one scrape sees one replica; tell them apart by that label.
- A replica that dies (its process killed, the node lost): the requests it was
  serving end at once with an error at the client, never a hang: Ray's proxy
  answers 500 (its own plain-text body) if the response had not started, and
  cuts a stream that had (the client sees the body end without `data: [DONE]`).
  Ray starts a replacement; meanwhile the other replicas serve. check_health has
  Ray replace a replica whose engine thread stopped, too.

Batch inference. Generator and Embedder are callable classes for
ray.data.Dataset.map_batches: each actor loads one in-process LLM and runs a
whole batch through it at once (continuous batching), returning the batch's
columns plus the generation's (or the embedding)."""
from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import signal
import threading
import types
import typing
from pathlib import Path
from typing import Any

import numpy as np

try:
    import ray
    from ray import serve
    from ray.serve import Application
except ImportError as exc:
    raise ImportError(f'armllm.ray needs Ray: pip install "armllm[ray]" ({exc})') from exc

from armllm import ops
from armllm.api import LLM, AsyncLLM
from armllm.engine import topology
from armllm.engine.args import EngineArgs
from armllm.model import hub
from armllm.sampling import SamplingParams
from armllm.server.app import ServerApp, create_app
from armllm.server.state import ServerConfig

log = logging.getLogger("armllm.ray")

__all__ = ["build_app", "app_from_config", "app_builder", "run_server", "Generator",
           "Embedder"]

APP_NAME = "armllm"
ENGINE_FIELDS = {f.name: f.default for f in dataclasses.fields(EngineArgs)}
# the ServerConfig fields build_app takes as keywords besides the engine's
SERVER_OPTIONS = ("max_waiting_requests", "max_request_bytes", "log_interval_s",
                  "shutdown_grace_s", "body_timeout_s", "tool_call_parser")
# engine arguments a replica cannot honour: it is one engine process, placed by Ray
NOT_UNDER_RAY = ("data_parallel_size", "tensor_parallel_size", "cpus")
# what huggingface_hub reads that a replica needs as the driver has it: the token for
# gated and private repos, a mirror, offline mode (the cache folder is each machine's own)
HUB_ENV = ("HF_TOKEN", "HF_ENDPOINT", "HF_HUB_OFFLINE")
# requests a replica takes beyond its engine's batch (max_num_seqs), so that /health and
# /metrics get through to a busy replica (generations that take them wait in its engine)
_SPARE_REQUESTS = 4
# how often run_server looks for a SIGINT/SIGTERM caught on another thread (seconds)
_SIGNAL_POLL_S = 0.2


# ---- serving ----

@serve.deployment(name=APP_NAME)
@serve.ingress()
class OpenAIServer:
    """One replica: an AsyncLLM (loaded before the replica reports ready) behind
    armllm's app, whose lifespan Ray runs (its shutdown stops the engine thread)."""

    async def __init__(self, config: ServerConfig):
        replica = serve.get_replica_context().replica_tag
        self._config = dataclasses.replace(
            config, metrics_labels={**config.metrics_labels, "replica": replica})
        engine_args, self._cpus = _claimed(config.engine_args)
        # loading takes seconds to minutes: off the replica's event loop
        self._llm = await asyncio.to_thread(AsyncLLM, config.model, **engine_args)

    def __serve_build_asgi_app__(self) -> ServerApp:
        return create_app(self._config, self._llm)

    def check_health(self) -> None:
        """Ray's periodic health check: a replica whose engine stopped is replaced."""
        if not self._llm.is_running:
            raise RuntimeError(f"the engine stopped: {self._llm.failure}")


def build_app(model: str | Path, num_replicas: int | None = None,
              autoscaling_config: dict | None = None, served_model_name: str | None = None,
              api_key: str | None = None, **options) -> Application:
    """The Ray Serve application serving `model` (a path that exists on every node,
    or a Hugging Face Hub name: checked here, then downloaded by each replica on its
    own node, pinned to the commit the Hub lists now; see `hub.pin`) with
    `num_replicas` replicas (default 1), or as many as Ray Serve's
    `autoscaling_config` says. `options`: EngineArgs fields (threads, max_num_seqs,
    dtype, ...) and the server's own (SERVER_OPTIONS: max_waiting_requests, ...).
    Run it with serve.run(app, route_prefix="/")."""
    server = {name: options.pop(name) for name in SERVER_OPTIONS if name in options}
    for name in options:
        if name not in ENGINE_FIELDS:
            raise ValueError(f"{name}: not an engine argument (EngineArgs) nor a server "
                             f"option ({', '.join(SERVER_OPTIONS)})")
    # named as armllm serve names it: a Hub name as typed, else the file or directory
    by_name = not Path(model).exists() and hub.parse_name(str(model)) is not None
    name = served_model_name or (str(model) if by_name
                                 else Path(model).name.removesuffix(".gguf"))
    config = ServerConfig(str(model), name, options, api_key, **server)
    return app_from_config(config, num_replicas, autoscaling_config)


def app_from_config(config: ServerConfig, num_replicas: int | None = None,
                    autoscaling_config: dict | None = None) -> Application:
    """build_app's application over a ServerConfig (what `armllm serve --ray` builds)."""
    engine_args = dict(config.engine_args)
    for name in NOT_UNDER_RAY:
        value = engine_args.get(name, ENGINE_FIELDS[name])
        if value != ENGINE_FIELDS[name]:
            raise ValueError(f"{name}={value!r}: a Ray Serve replica is one engine process; "
                             "scale with num_replicas (Ray places each replica)")
    engine_args["threads"] = engine_args.get("threads") or ops.num_threads()
    args = EngineArgs(**engine_args)  # raises ValueError naming a bad value
    model = hub.pin(config.model)   # a HubError (ValueError) for a bad Hub name
    if model == config.model and not Path(model).exists():
        raise ValueError(f"{model}: no such model file or directory (Ray replicas serve a "
                         "path every node has, or a Hugging Face Hub name)")
    actor_options: dict[str, Any] = {"num_cpus": args.threads}
    if model != config.model:   # a Hub name: each replica downloads it where it runs
        hub_env = {k: os.environ[k] for k in HUB_ENV if k in os.environ}
        if hub_env:
            actor_options["runtime_env"] = {"env_vars": hub_env}
    if autoscaling_config is not None and num_replicas is not None:
        raise ValueError("num_replicas and autoscaling_config exclude each other")
    if num_replicas is not None and (isinstance(num_replicas, bool)
                                     or not isinstance(num_replicas, int) or num_replicas < 1):
        raise ValueError(f"num_replicas must be an integer >= 1, got {num_replicas!r}")
    scaling = {"autoscaling_config": autoscaling_config} if autoscaling_config is not None \
        else {"num_replicas": num_replicas or 1}
    # a replica gets what its engine runs at once; the rest wait in Ray's router, which
    # hands each to the first replica with room (up to max_waiting_requests per proxy;
    # beyond, Ray answers 503)
    deployment = OpenAIServer.options(
        ray_actor_options=actor_options,
        max_ongoing_requests=args.max_num_seqs + _SPARE_REQUESTS,
        max_queued_requests=max(1, config.max_waiting_requests),  # Ray's least is 1
        graceful_shutdown_timeout_s=config.shutdown_grace_s, **scaling)
    return deployment.bind(dataclasses.replace(config, model=model, engine_args=engine_args))


def app_builder(args: dict[str, Any]) -> Application:
    """The application builder of Ray's command line and config files:
    `serve run armllm.ray:app_builder model=PATH num_replicas=2 threads=1 ...` (each
    key one of build_app's arguments; values given as strings are converted to the
    argument's type, autoscaling_config from JSON)."""
    args = dict(args)
    if "model" not in args:
        raise ValueError("model=PATH is required")
    return build_app(**{name: _from_string(name, value) for name, value in args.items()})


def _from_string(name: str, value: Any) -> Any:
    if not isinstance(value, str):
        return value
    kind = _OPTION_TYPES.get(name, str)
    try:
        if kind is bool:
            return {"true": True, "1": True, "yes": True,
                    "false": False, "0": False, "no": False}[value.lower()]
        return json.loads(value) if kind is dict else kind(value)
    except (KeyError, ValueError):
        raise ValueError(f"{name} must be {kind.__name__}, got {value!r}") from None


def _base_type(hint) -> type:
    """int for `int | None`, str for `str | Path`, dict for `dict[str, str]`."""
    if isinstance(hint, types.UnionType):
        hint = next(t for t in typing.get_args(hint) if t is not type(None))
    return typing.get_origin(hint) or hint


_OPTION_TYPES = {name: _base_type(hint) for name, hint in
                 {**typing.get_type_hints(EngineArgs), **typing.get_type_hints(ServerConfig),
                  "num_replicas": int, "autoscaling_config": dict}.items()}


def run_server(app: Application, address: str | None, host: str, port: int) -> int:
    """`armllm serve --ray`: connects to the cluster at `address` (default: RAY_ADDRESS
    or the cluster started last on this machine, else a new local one), runs `app`
    with Ray Serve's HTTP proxy on host:port (on every node), and blocks until
    SIGINT/SIGTERM; then deletes the app (and stops Serve if no other app runs on the
    cluster). Returns the exit status: 0, or 1 if the app could not start; a signal
    while it deploys raises KeyboardInterrupt (after the same cleanup)."""
    ray.init(address=address)
    stopping = threading.Event()

    def on_signal(signum, frame) -> None:
        if not serving:  # still deploying (replicas Ray cannot place wait forever): abort
            raise KeyboardInterrupt
        stopping.set()

    serving = False
    # after ray.init, whose own SIGTERM handler would print a stack trace first
    handlers = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        serve.start(http_options={"host": host, "port": port})
        try:
            serve.run(app, name=APP_NAME, route_prefix="/")
        except RuntimeError as exc:
            log.error("the app failed to start: %s", exc)
            return 1
        serving = True
        # (Ray says where: a Serve already running keeps its own host and port)
        log.info("serving until SIGINT/SIGTERM")
        # the kernel may deliver the signal to one of Ray's threads; its Python handler
        # then runs when this thread next runs Python code, so wake up now and then
        while not stopping.wait(_SIGNAL_POLL_S):
            pass
        log.info("shutting down")
        return 0
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
        serve.delete(APP_NAME)
        if not serve.status().applications:
            serve.shutdown()
        ray.shutdown()


def _claimed(engine_args: dict) -> tuple[dict, topology.CpuClaim | None]:
    """The engine arguments of an engine Ray placed in this process, with `cpus` set
    to its `threads` CPUs of one NUMA node that no other armllm process of this
    machine holds (claimed here: the claim returned must live as long as the
    engine), which the engine binds its threads and memory to; unchanged where
    the CPUs are given, the threads take the whole machine, or no node has that
    many free."""
    threads = engine_args.get("threads")
    if engine_args.get("cpus") is not None or not threads:
        return engine_args, None
    if threads >= len(os.sched_getaffinity(0)):   # the whole machine: nothing to choose
        return engine_args, None
    claim = topology.claim_cpus(threads)
    if claim is None:
        log.warning("no NUMA node of this machine has %d CPUs that no other armllm "
                    "process holds: this engine runs unpinned", threads)
        return engine_args, None
    cpus = topology.format_cpulist(claim.cpus)
    log.info("engine threads on CPUs %s (NUMA node %d)", cpus, claim.node)
    return {**engine_args, "cpus": cpus}, claim


# ---- batch inference (Ray Data) ----

def _load(model: str | Path, engine_args: dict) -> tuple[LLM, topology.CpuClaim | None]:
    """An LLM whose kernel threads default to the CPUs Ray reserved for this actor
    (map_batches' num_cpus), on CPUs of its own (_claimed) when Ray placed it, so that
    actors sharing a node do not oversubscribe it; and its CPUs' claim."""
    if not ray.is_initialized():
        return LLM(model, **engine_args), None
    if engine_args.get("threads") is None:
        cpus = ray.get_runtime_context().get_assigned_resources().get("CPU")
        if cpus:
            engine_args = {**engine_args, "threads": max(1, int(cpus))}
    engine_args, claim = _claimed(engine_args)
    return LLM(model, **engine_args), claim


def _prompt(value) -> str | list[int]:
    """One row's prompt: a string, or token ids (a list or an integer array)."""
    if isinstance(value, str):
        return str(value)
    if isinstance(value, (list, np.ndarray)):
        return [int(t) for t in value]
    raise ValueError(f"a prompt is a string or token ids, got {type(value).__name__}")


def _messages(value) -> list[dict]:
    """One row's conversation (Ray Data may hand it over as an array of dicts)."""
    return [{str(k): (str(v) if isinstance(v, np.str_) else v) for k, v in dict(m).items()}
            for m in value]


class Generator:
    """Text generation over a Ray Data dataset, one LLM per actor:

        ds.map_batches(Generator, fn_constructor_kwargs={"model": path, "sampling":
                       {"max_tokens": 64, "temperature": 0}, "threads": 4},
                       compute=ray.data.ActorPoolStrategy(size=N), num_cpus=4,
                       batch_size=64)

    A row's prompt is its `prompt_column` (a string or token ids) or, where the batch
    has no such column, its `messages_column` (a list of {role, content}), rendered
    with the model's chat template. `sampling`: SamplingParams, or a dict of their
    fields over the model's defaults (None: the defaults); n must be 1 (a row per
    prompt). engine_args are EngineArgs fields (threads: default num_cpus)."""

    def __init__(self, model: str | Path, sampling: SamplingParams | dict | None = None,
                 prompt_column: str = "prompt", messages_column: str = "messages",
                 **engine_args):
        self._llm, self._cpus = _load(model, engine_args)
        if isinstance(sampling, SamplingParams):
            self._params = sampling
        elif sampling is None or isinstance(sampling, dict):
            known = {f.name for f in dataclasses.fields(SamplingParams)}
            for name in sampling or {}:
                if name not in known:
                    raise ValueError(f"sampling: {name!r} is not a SamplingParams field")
            self._params = self._llm.default_sampling_params(**(sampling or {}))
        else:
            raise ValueError(f"sampling must be SamplingParams, a dict or None, got "
                             f"{type(sampling).__name__}")
        if self._params.n != 1:
            raise ValueError(f"sampling n must be 1 (one output row per prompt), got "
                             f"{self._params.n}")
        self._prompt_column, self._messages_column = prompt_column, messages_column

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray | list]:
        """The batch's columns plus generated_text, generated_token_ids, finish_reason,
        num_prompt_tokens, num_generated_tokens, ttft_s and e2e_s (seconds from the
        batch entering the engine)."""
        batch, prompts = self._prompts(batch)
        outs = self._llm.generate(prompts, self._params) if prompts else []
        metrics = [o.outputs[0].metrics for o in outs]
        return {**batch,
                "generated_text": np.array([o.text for o in outs], dtype=object),
                "generated_token_ids": [np.array(o.token_ids, np.int64) for o in outs],
                "finish_reason": np.array([o.finish_reason for o in outs], dtype=object),
                "num_prompt_tokens": np.array([len(o.prompt_token_ids) for o in outs],
                                              np.int64),
                "num_generated_tokens": np.array([len(o.token_ids) for o in outs], np.int64),
                "ttft_s": _seconds(metrics, "ttft_s"), "e2e_s": _seconds(metrics, "e2e_s")}

    def _prompts(self, batch: dict[str, np.ndarray]) -> tuple[dict, list]:
        """The batch (its conversations as lists of dicts, which Arrow stores as it
        read them) and its prompts."""
        if self._prompt_column in batch:
            return batch, [_prompt(p) for p in batch[self._prompt_column]]
        if self._messages_column in batch:
            conversations = [_messages(m) for m in batch[self._messages_column]]
            return ({**batch, self._messages_column: conversations},
                    [self._llm.chat_prompt(c) for c in conversations])
        raise ValueError(f"the batch has neither a {self._prompt_column!r} nor a "
                         f"{self._messages_column!r} column (columns: {', '.join(batch)})")


def _seconds(metrics: list, name: str) -> np.ndarray:
    """One timing of every completion (NaN where there is none)."""
    values = [getattr(m, name) if m is not None else None for m in metrics]
    return np.array([np.nan if v is None else v for v in values], np.float64)


class Embedder:
    """Embeddings over a Ray Data dataset, one LLM per actor (as Generator): adds an
    `embedding` column (float32 vectors of the model's size, or `dimensions` where the
    model allows truncating) for the text (or token ids) of `input_column`."""

    def __init__(self, model: str | Path, input_column: str = "text",
                 dimensions: int | None = None, **engine_args):
        self._llm, self._cpus = _load(model, engine_args)
        self._column, self._dimensions = input_column, dimensions

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        if self._column not in batch:
            raise ValueError(f"the batch has no {self._column!r} column (columns: "
                             f"{', '.join(batch)})")
        texts = [_prompt(t) for t in batch[self._column]]
        if not texts:
            return {**batch, "embedding": np.zeros((0, 0), np.float32)}
        outs = self._llm.embed(texts, self._dimensions)
        return {**batch, "embedding": np.stack([o.embedding for o in outs])}
