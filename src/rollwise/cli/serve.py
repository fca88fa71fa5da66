"""`rollwise serve --model DIR [--host H] [--port P] ...`: an OpenAI-compatible server with log-probs.

Endpoints: POST /v1/completions, POST /v1/chat/completions, GET /v1/models, GET /health, and, with an admin
key (--admin-key or ROLLWISE_ADMIN_KEY), POST /admin/load_weights to load new weights from a checkpoint
directory (also under SGLang's /update_weights_from_disk and vLLM's /collective_rpc reload_weights names).
See docs/serve.md. SIGINT/SIGTERM stop accepting requests, let running ones finish for --drain seconds,
then abort the rest.
"""

from __future__ import annotations

import argparse
import math
import os
import signal
import sys
import threading
from typing import Any

from rollwise.cli.terminal import say


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser("serve", help="OpenAI-compatible completions server with log-probs",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="HF checkpoint directory (config.json + safetensors)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="port (default 8000; 0 picks a free one)")
    p.add_argument("--served-model-name", help="the `model` clients send (default: --model as given)")
    p.add_argument("--dtype", default="float32", help="float32, bfloat16 or float16")
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    p.add_argument("--admin-key", default=None,
                   help="Bearer key for the weight-loading routes (default: $ROLLWISE_ADMIN_KEY; unset disables them)")
    p.add_argument("--max-num-seqs", type=int, default=256, help="most sequences decoded together")
    p.add_argument("--max-num-batched-tokens", type=int, default=8192, help="token budget of one prefill step")
    p.add_argument("--max-model-len", type=int, default=None, help="longest prompt + output")
    p.add_argument("--kv-cache-gb", type=float, default=4.0, help="memory cap of the KV cache")
    p.add_argument("--block-size", type=int, default=16, help="tokens per KV-cache block")
    p.add_argument("--seed", type=int, default=0, help="seeds requests sent without a seed")
    p.add_argument("--drain", type=float, default=5.0, help="seconds running requests get to finish on shutdown")
    p.add_argument("--log-level", default="warning", help="debug, info, warning or error")
    g = p.add_argument_group("connection limits", "what one client can hold (see docs/serve.md)")
    g.add_argument("--max-connections", type=int, default=512,
                   help="most connections held (also capped by the descriptor limit, ulimit -n, less 64); at the cap "
                        "idle ones are closed to admit new ones, else the new one gets 503 (default 512)")
    g.add_argument("--header-timeout", type=float, default=10.0,
                   help="seconds to deliver a request line and headers, also the keep-alive idle limit (default 10)")
    g.add_argument("--body-timeout", type=float, default=30.0,
                   help="seconds a request body gets, plus 1 s per MiB (default 30)")
    g.add_argument("--write-timeout", type=float, default=60.0,
                   help="seconds a client may stop reading its response before it is dropped (default 60)")
    g.add_argument("--max-buffered-mb", type=float, default=256.0,
                   help="request-body MiB held across all connections; over it a request gets 503 (default 256)")


def run(args: argparse.Namespace) -> int:
    import logging

    from rollwise.cli.main import UserError

    if not 0 <= args.port < 65536:
        raise UserError(f"--port must be in [0, 65535], got {args.port}")
    from rollwise.models.convert import ModelResolveError, resolve_model

    try:  # an HF directory, a .gguf file, 'smollm2-135m' or a hub id: the server reloads from the resolved directory
        model_dir = str(resolve_model(args.model))
    except ModelResolveError as e:
        raise UserError(f"--model {args.model}: {e}") from None
    if not os.path.isdir(model_dir):
        raise UserError(f"--model {args.model}: not a directory" + ("" if os.path.exists(model_dir) else " (no such path)"))
    logging.basicConfig(level=getattr(logging, str(args.log_level).upper(), logging.WARNING),
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    for flag, v in (("--header-timeout", args.header_timeout), ("--body-timeout", args.body_timeout),
                    ("--write-timeout", args.write_timeout), ("--max-buffered-mb", args.max_buffered_mb)):
        if not (v > 0 and math.isfinite(v)):
            raise UserError(f"{flag} must be a positive number, got {v}")
    if args.max_connections < 1:
        raise UserError(f"--max-connections must be at least 1, got {args.max_connections}")
    from rollwise.serve.conn import ConnLimits

    limits = ConnLimits(header_timeout_s=args.header_timeout, body_timeout_s=args.body_timeout,
                        write_timeout_s=args.write_timeout, max_connections=args.max_connections,
                        max_buffered_mb=args.max_buffered_mb)
    from rollwise.engine.core import EngineConfig, EngineCore
    from rollwise.serve.app import OpenAIServer, ServeConfig

    key = args.admin_key or os.environ.get("ROLLWISE_ADMIN_KEY") or None
    cfg = EngineConfig(max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
                       max_model_len=args.max_model_len, kv_cache_gb=args.kv_cache_gb, block_size=args.block_size)
    engine = EngineCore.from_pretrained(model_dir, device=args.device, dtype=args.dtype, config=cfg, seed=args.seed)
    try:
        server = OpenAIServer(engine, model_dir, ServeConfig(host=args.host, port=args.port,
                                                              served_model_name=args.served_model_name,
                                                              admin_key=key, limits=limits))
    except OSError as e:
        raise UserError(f"cannot listen on {args.host}:{args.port}: {e.strerror or e}") from None
    stopping = threading.Event()

    def _stop(signum: int, _frame: Any) -> None:
        if stopping.is_set():
            return
        stopping.set()
        print(f"rollwise serve: {signal.Signals(signum).name}, shutting down", file=sys.stderr, flush=True)
        # shutdown() waits for serve_forever to return, so it must run off the serving thread.
        threading.Thread(target=server.shutdown, kwargs={"drain_s": args.drain}, daemon=True).start()

    signal.signal(signal.SIGINT, _stop)
    signal.signal(signal.SIGTERM, _stop)
    admin = "admin routes on" if key else "admin routes off (no --admin-key)"
    say(f"rollwise serve: {server.info.name} on {server.url} (max_model_len={server.info.max_model_len}, {admin})",
        file=sys.stderr, flush=True)
    server.serve_forever()
    server.shutdown(drain_s=args.drain)  # waits for the signal handler's shutdown when it started one
    return 0
