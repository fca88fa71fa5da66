"""`rollwise serve` under load vs the in-process engine, side by side on the same model and workload.

The server runs as its own process (`rollwise serve`, as users run it); C client threads each send R
/v1/completions requests back to back (token-id prompts, logprobs on), then the same prompts go through
`RemoteEngine.generate` (the RL client path, all at once) and through the in-process `LLM.generate` (one
call, the ideal batch), with the same torch thread count on both sides (--threads), interleaved for --repeats rounds (best of each kept). Reported: per-request latency p50/p99 for the clients, completion tokens/s for all
three, and the server/in-process ratio.

    python bench/serve.py [--size 4m|25m|qwen0.5b] [--clients 64] [--requests 2] [--n 1] [--max-tokens 64]
                          [--device cpu|cuda] [--dtype float32|bfloat16] [--ignore-eos] [--repeats 2] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from generate import SIZES, VOCAB, make_model  # noqa: E402  (bench/generate.py: the shared model sizes)


def make_prompts(count: int, vocab: int, seed: int = 1) -> list[list[int]]:
    import random

    rng = random.Random(seed)
    return [[rng.randrange(4, vocab) for _ in range(rng.randrange(8, 24))] for _ in range(count)]


def start_server(model: Path, device: str, dtype: str, max_num_seqs: int,
                 threads: int | None) -> tuple[subprocess.Popen, str]:
    # The CLI's own entry point, without needing the `rollwise` console script installed (a bare GPU box).
    exe = [sys.executable, "-c", "import sys; from rollwise.cli.main import main; sys.exit(main())"]
    env = dict(os.environ, **({"OMP_NUM_THREADS": str(threads)} if threads else {}))
    src = str(Path(__file__).resolve().parents[1] / "src")
    env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.Popen([*exe, "serve", "--model", str(model), "--port", "0", "--device", device, "--dtype", dtype,
                             "--served-model-name", "bench", "--max-num-seqs", str(max_num_seqs),
                             "--max-model-len", "1024"], stderr=subprocess.PIPE, text=True, env=env)
    line = proc.stderr.readline()
    if " on http://" not in line:
        proc.kill()
        raise SystemExit(f"server did not start: {line}{proc.stderr.read()[-2000:]}")
    threading.Thread(target=proc.stderr.read, daemon=True).start()  # keep draining its log
    return proc, line.split(" on ")[1].split()[0]


def client_load(url: str, prompts: list[list[int]], clients: int, n: int, max_tokens: int, ignore_eos: bool):
    import http.client

    host, port = url.split("//")[1].split(":")
    local = threading.local()
    lat: list[float] = []
    toks = [0]
    errors: list[str] = []
    lock = threading.Lock()

    def one(i: int) -> None:
        conn = getattr(local, "c", None) or http.client.HTTPConnection(host, int(port), timeout=600)
        local.c = conn
        body = json.dumps({"model": "bench", "prompt": prompts[i], "n": n, "max_tokens": max_tokens, "seed": i,
                           "ignore_eos": ignore_eos, "logprobs": 1, "return_token_ids": True})
        t = time.perf_counter()
        conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
        r = conn.getresponse()
        data = r.read()
        dt = time.perf_counter() - t
        with lock:
            if r.status != 200:
                errors.append(f"{r.status}: {data[:200]!r}")
                return
            lat.append(dt)
            toks[0] += json.loads(data)["usage"]["completion_tokens"]

    t0 = time.perf_counter()
    with ThreadPoolExecutor(clients) as ex:
        list(ex.map(one, range(len(prompts))))
    wall = time.perf_counter() - t0
    lat.sort()
    return {"requests": len(prompts), "errors": len(errors), "first_error": errors[0] if errors else None,
            "p50_ms": 1e3 * lat[len(lat) // 2] if lat else None,
            "p99_ms": 1e3 * lat[min(len(lat) - 1, int(0.99 * len(lat)))] if lat else None,
            "tokens": toks[0], "wall_s": wall, "tokens_per_s": toks[0] / wall}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="4m", choices=sorted(SIZES))
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--requests", type=int, default=2, help="requests per client")
    ap.add_argument("--n", type=int, default=1, help="samples per request")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--ignore-eos", action="store_true")
    ap.add_argument("--repeats", type=int, default=2, help="interleaved runs; the best of each is reported")
    ap.add_argument("--threads", type=int, default=None,
                    help="torch CPU threads for both sides (OMP_NUM_THREADS for the server); default: torch's")
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args()

    import torch

    from rollwise import LLM, SamplingParams
    from rollwise.clients.remote import RemoteEngine

    if args.threads:
        torch.set_num_threads(args.threads)
    vocab = SIZES[args.size].get("vocab_size", VOCAB)
    num = args.clients * args.requests
    prompts = make_prompts(num, vocab)
    max_seqs = max(args.clients * args.n, 8)
    sps = [SamplingParams(n=args.n, max_tokens=args.max_tokens, seed=i, ignore_eos=args.ignore_eos)
           for i in range(num)]
    best: dict[str, dict] = {}

    def keep(name: str, r: dict) -> None:  # best of the repeats: the machine may be shared and noisy
        if name not in best or r["tokens_per_s"] > best[name]["tokens_per_s"]:
            best[name] = r

    with tempfile.TemporaryDirectory() as d:
        model = make_model(args.size, Path(d) / "m")
        llm = LLM(model, device=args.device, dtype=args.dtype, max_num_seqs=max_seqs, max_model_len=1024)
        llm.generate(prompts[:4], SamplingParams(max_tokens=4))  # warm-up
        proc, url = start_server(model, args.device, args.dtype, max_seqs, args.threads)
        try:
            warm = client_load(url, prompts[:4], 4, 1, 4, True)
            assert warm["errors"] == 0, warm
            eng = RemoteEngine(url, max_concurrency=args.clients)
            for _ in range(args.repeats):  # interleaved, so a noisy neighbour hits all three alike
                keep("server_clients", client_load(url, prompts, args.clients, args.n, args.max_tokens,
                                                   args.ignore_eos))
                t = time.perf_counter()
                outs = eng.generate(prompts, sps)
                dt = time.perf_counter() - t
                tok = sum(len(o.token_ids) for r in outs for o in r.outputs)
                keep("server_remote_engine", {"tokens": tok, "wall_s": dt, "tokens_per_s": tok / dt})
                if args.device == "cuda":
                    torch.cuda.synchronize()
                t = time.perf_counter()
                local = llm.generate(prompts, sps)
                if args.device == "cuda":
                    torch.cuda.synchronize()
                dt = time.perf_counter() - t
                tok = sum(len(o.token_ids) for r in local for o in r.outputs)
                keep("in_process", {"tokens": tok, "wall_s": dt, "tokens_per_s": tok / dt})
            eng.close()
        finally:
            proc.terminate()
            proc.wait(timeout=60)
    served = best["server_clients"]
    res = {
        "size": args.size, "device": args.device, "dtype": args.dtype, "clients": args.clients,
        "requests": num, "n": args.n, "max_tokens": args.max_tokens, "ignore_eos": args.ignore_eos,
        "repeats": args.repeats, "threads": torch.get_num_threads(), **best,
    }
    res["ratio_clients_vs_in_process"] = served["tokens_per_s"] / res["in_process"]["tokens_per_s"]
    res["ratio_remote_engine_vs_in_process"] = res["server_remote_engine"]["tokens_per_s"] / res["in_process"]["tokens_per_s"]
    s = served
    print(f"{args.size} on {args.device}/{args.dtype}: {num} requests x n={args.n}, max_tokens {args.max_tokens}, "
          f"{args.clients} clients, {torch.get_num_threads()} torch threads")
    print(f"  server, {args.clients} clients : p50 {s['p50_ms']:.0f} ms  p99 {s['p99_ms']:.0f} ms  "
          f"{s['tokens_per_s']:.0f} tok/s  errors {s['errors']}")
    print(f"  server, RemoteEngine   : {res['server_remote_engine']['tokens_per_s']:.0f} tok/s")
    print(f"  in-process LLM         : {res['in_process']['tokens_per_s']:.0f} tok/s")
    print(f"  ratio server/in-process: clients {res['ratio_clients_vs_in_process']:.2f}, "
          f"RemoteEngine {res['ratio_remote_engine_vs_in_process']:.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=2))
    if s["errors"]:
        raise SystemExit(f"{s['errors']} failed requests; first: {s['first_error']}")


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
