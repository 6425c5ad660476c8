"""`armllm serve`: the command line of the OpenAI-compatible server: the engine
flags (EngineArgs'), the server's own (address, key, admission and connection
limits, audio limits, the responses store, timeouts, shutdown grace), checked
here; server/serving.py runs it."""
from __future__ import annotations

import argparse
import dataclasses
import logging
import os
from pathlib import Path

from armllm.cmdline import UsageError, add_model_argument, resolve_model
from armllm.engine.args import EngineArgs
from armllm.server.parsers import TOOL_CALL_PARSERS

# connections beyond the completions the server admits: /health, /metrics, requests
# refused with 503 and idle keep-alive connections of the clients' pools
_SPARE_CONNECTIONS = 256


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_model_argument(p)
    p.add_argument("--host", default="127.0.0.1",
                   help="address to bind (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--served-model-name", default=None,
                   help="the model name clients send (default: the model file or folder name)")
    p.add_argument("--api-key", default=os.environ.get("ARMLLM_API_KEY"),
                   help="require 'Authorization: Bearer KEY' (default: $ARMLLM_API_KEY)")
    p.add_argument("--max-waiting-requests", type=int, default=256,
                   help="completions (n per prompt) admitted beyond --max-num-seqs to wait "
                        "their turn; more get 503, and a request with more than both "
                        "together gets 400")
    p.add_argument("--max-request-bytes", type=int, default=4 << 20,
                   help="largest request body accepted")
    p.add_argument("--max-audio-seconds", type=float, default=3600.0,
                   help="longest audio /v1/audio/transcriptions and /translations accept "
                        "(longer: 400) (default 3600)")
    p.add_argument("--max-audio-mb", type=float, default=100.0,
                   help="largest audio upload in MiB (larger: 413, as OpenAI answers an "
                        "upload over its limit) (default 100)")
    p.add_argument("--log-interval", type=float, default=10.0,
                   help="seconds between stats lines (0: none)")
    p.add_argument("--shutdown-grace", type=float, default=10.0,
                   help="seconds in-flight requests get to finish on SIGINT/SIGTERM; then "
                        "each still running ends with an error")
    p.add_argument("--limit-concurrency", type=int, default=None,
                   help="open connections at most; beyond it requests get 503 (default: "
                        f"--max-num-seqs + --max-waiting-requests + {_SPARE_CONNECTIONS})")
    p.add_argument("--timeout-keep-alive", type=float, default=5.0,
                   help="seconds an idle connection stays open after a response (default 5)")
    p.add_argument("--timeout-request-read", type=float, default=30.0,
                   help="seconds a client gets to send a request's headers (from connecting "
                        "or its previous response), and again its body; slower clients are "
                        "disconnected (headers) or answered 408 (body) (default 30)")
    p.add_argument("--tool-call-parser", default="auto", choices=TOOL_CALL_PARSERS,
                   help="how the model writes tool calls: hermes (Qwen2.5/3, Hermes), "
                        "qwen3_coder (Qwen3-Coder, Qwen3.5/3.6: XML), llama3_json (Llama "
                        "3.1/3.2), mistral, harmony (GPT-OSS) (default "
                        "auto: harmony for a harmony tokenizer, else the one its chat "
                        "template names)")
    p.add_argument("--responses-store-size", type=int, default=1024,
                   help="responses /v1/responses keeps for previous_response_id and GET "
                        "(the oldest go first; 0: none kept) (default 1024)")
    p.add_argument("--responses-store-ttl", type=float, default=3600.0,
                   help="seconds a stored response is kept (default 3600)")
    p.add_argument("--log-level", default="info",
                   choices=["critical", "error", "warning", "info", "debug"])
    ray = p.add_argument_group("ray (pip install \"armllm[ray]\"; see armllm/ray.py)")
    ray.add_argument("--ray", action="store_true",
                     help="serve with Ray Serve: --num-replicas engines over the cluster, each "
                          "reserving --threads CPUs, behind Ray's HTTP proxy on --host/--port")
    ray.add_argument("--ray-address", default=None,
                     help="the Ray cluster (default: $RAY_ADDRESS, else the cluster started "
                          "last on this machine, else a new local one)")
    ray.add_argument("--num-replicas", type=int, default=1, help="Ray Serve replicas")
    EngineArgs.add_cli_args(p)


# flags of the uvicorn front end and of in-process parallelism, which Ray Serve replaces
# (its HTTP proxy, and replicas it places: one engine process each)
_NOT_UNDER_RAY = ("limit_concurrency", "timeout_keep_alive", "timeout_request_read",
                  "data_parallel_size", "tensor_parallel_size", "cpus")
_RAY_ONLY = ("ray_address", "num_replicas")


def _check_ray_flags(args: argparse.Namespace) -> None:
    """Refuses flags given (set to other than their default) that --ray excludes, or
    that need it."""
    defaults = argparse.ArgumentParser()
    add_arguments(defaults)
    names = _NOT_UNDER_RAY if args.ray else _RAY_ONLY
    for name in names:
        if getattr(args, name) != defaults.get_default(name):
            flag = "--" + name.replace("_", "-")
            raise UsageError(f"{flag} does not apply under --ray" if args.ray
                             else f"{flag} needs --ray")


def _positive(name: str, value, minimum=1) -> None:
    if value is not None and value < minimum:
        raise UsageError(f"{name} must be >= {minimum}, got {value}")


def cmd_serve(args: argparse.Namespace) -> int:
    # the server and the engine load when the command runs (see armllm/cli.py)
    from armllm.model.loader import model_path
    from armllm.server.app import ServerConfig, create_app
    from armllm.server.serving import Limits, serve
    _check_ray_flags(args)
    for name in ("port", "max_request_bytes", "limit_concurrency", "num_replicas"):
        _positive("--" + name.replace("_", "-"), getattr(args, name))
    _positive("--max-waiting-requests", args.max_waiting_requests, 0)
    _positive("--responses-store-size", args.responses_store_size, 0)
    for name in ("timeout_keep_alive", "timeout_request_read", "max_audio_seconds",
                 "max_audio_mb", "responses_store_ttl"):
        if not getattr(args, name) > 0:
            raise UsageError(f"--{name.replace('_', '-')} must be > 0, got "
                             f"{getattr(args, name)}")
    if args.port > 65535:
        raise UsageError(f"--port must be <= 65535, got {args.port}")
    try:
        engine_args = dataclasses.asdict(EngineArgs.from_cli_args(args))
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    model = resolve_model(args.model)
    try:   # a Hub name downloads now, before the server starts (under --ray, each
        # replica downloads it where it runs: app_from_config checks and pins it)
        model = str(model if args.ray else model_path(model))
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    by_name = args.model is not None and not Path(args.model).exists()   # from the Hub
    # served as the user named it (ORG/NAME, as vLLM does), else as the file or directory
    name = args.served_model_name or (args.model if by_name
                                      else Path(model).name.removesuffix(".gguf"))
    config = ServerConfig(model, name, engine_args, args.api_key, args.max_waiting_requests,
                          args.max_request_bytes, args.log_interval, args.shutdown_grace,
                          args.timeout_request_read, args.tool_call_parser,
                          max_audio_seconds=args.max_audio_seconds,
                          max_audio_bytes=int(args.max_audio_mb * 2**20),
                          responses_store_size=args.responses_store_size,
                          responses_store_ttl_s=args.responses_store_ttl)
    limits = Limits(args.limit_concurrency or engine_args["max_num_seqs"]
                    + args.max_waiting_requests + _SPARE_CONNECTIONS,
                    args.timeout_keep_alive, args.timeout_request_read)
    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.ray:
        return _serve_on_ray(args, config)
    return serve(create_app(config), args.host, args.port, limits, args.shutdown_grace,
                 args.log_level)


def _serve_on_ray(args: argparse.Namespace, config) -> int:
    """`armllm serve --ray`: the same app as --num-replicas Ray Serve replicas."""
    try:  # Ray loads only here: the default install neither needs nor imports it
        from armllm.ray import app_from_config, run_server
    except ImportError as exc:
        raise UsageError(f"--ray: {exc}") from None   # says what to install
    try:
        app = app_from_config(config, args.num_replicas)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    try:
        return run_server(app, args.ray_address, args.host, args.port)
    except ConnectionError as exc:
        raise UsageError(f"--ray-address: {exc}") from None
