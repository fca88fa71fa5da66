"""Remote engines: the in-process `LLM` calls over HTTP, and a `MultiEngine` that mixes engines in one run.

`RemoteEngine` speaks the OpenAI-compatible completions API of `rollwise serve`, vLLM or SGLang. Token in,
token out: prompts go as token ids, and the exact sampled token ids come back through vLLM's extensions
(`return_token_ids` adds `token_ids` to each choice; `return_tokens_as_token_ids` spells log-prob tokens as
`token_id:N`), never by re-tokenizing text. Each prompt is one HTTP request, sent concurrently from a thread
pool, so the server's continuous batch sees them all at once.

Weight reloads use each server's own route (see `RELOAD_ROUTES`):
- rollwise serve: POST /admin/load_weights, JSON {"path": DIR} or the safetensors bytes as the body;
- SGLang: POST /update_weights_from_disk {"model_path": DIR};
- vLLM: POST /collective_rpc {"method": "reload_weights"} (needs VLLM_SERVER_DEV_MODE=1). vLLM reloads from
  the model path it was started with, so `load_weights_from_dir(path)` requires `path` to be that
  directory (write the new checkpoint there first); anything else is refused with a message.

Against vLLM, start it with `--logprobs-mode processed_logprobs`: its default reports log-probs before
temperature, not the sampling distribution's.

Deliberately left out: retries of generation requests (a failed request raises; the caller decides) and
partial resumption (`partial=`), which the HTTP API cannot express.
"""

from __future__ import annotations

import http.client
import itertools
import json
import os
import socket
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence as Seq
from urllib.parse import urlsplit

from rollwise.engine.protocol import Engine  # noqa: F401 - re-exported: the protocol both classes implement
from rollwise.types import CompletionOutput, RequestOutput, SamplingParams

RELOAD_ROUTES = {
    "rollwise": "/admin/load_weights",
    "sglang": "/update_weights_from_disk",
    "vllm": "/collective_rpc",
}


class RemoteEngineError(RuntimeError):
    """A remote server failed, refused a request, or did not answer in time. The message says which."""


@dataclass
class _Response:
    status: int
    body: bytes

    def json(self) -> Any:
        try:
            return json.loads(self.body)
        except (json.JSONDecodeError, UnicodeDecodeError):
            return None


class RemoteEngine:
    """The `LLM` calls (`generate`, `load_weights`, `weight_version`, `tokenizer`) against an HTTP server.

    >>> eng = RemoteEngine("http://127.0.0.1:8000", api_key="ADMIN_KEY")
    >>> outs = eng.generate([[5, 6, 7]], SamplingParams(n=4, max_tokens=32, seed=0))
    """

    def __init__(self, base_url: str, model: str | None = None, api_key: str | None = None, timeout_s: float = 600.0,
                 backend: str = "rollwise", max_concurrency: int = 64, tokenizer: Any = None,
                 weights_dir: str | os.PathLike | None = None, connect_timeout_s: float = 10.0) -> None:
        """
        base_url: the server root, e.g. http://127.0.0.1:8000 (a trailing /v1 is accepted).
        model: the served model name; default: the first entry of GET /v1/models.
        api_key: sent as `Authorization: Bearer KEY` on every request (the admin key of rollwise serve).
        timeout_s: the longest one generation or weight-load request may take before RemoteEngineError.
        backend: "rollwise", "vllm" or "sglang": which weight-reload route to use.
        tokenizer: optional, only for string prompts' `prompt_token_ids` when the server does not return them.
        weights_dir: where `load_weights(state_dict)` writes its safetensors for vllm/sglang (a directory the
            server can read); rollwise serve gets the bytes in the request body instead.
        """
        if backend not in RELOAD_ROUTES:
            raise ValueError(f"backend must be one of {', '.join(RELOAD_ROUTES)}, got {backend!r}")
        if timeout_s <= 0 or max_concurrency < 1:
            raise ValueError("timeout_s must be > 0 and max_concurrency >= 1")
        url = base_url.rstrip("/")
        if url.endswith("/v1"):
            url = url[: -len("/v1")]
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"base_url must look like http://host:port, got {base_url!r}")
        self.base_url = url
        self._scheme = parts.scheme
        self._host = parts.hostname
        self._port = parts.port or (443 if parts.scheme == "https" else 80)
        self._prefix = parts.path
        self.api_key = api_key
        self.timeout_s = float(timeout_s)
        self.connect_timeout_s = float(connect_timeout_s)
        self.backend = backend
        self.tokenizer = tokenizer
        self.weights_dir = weights_dir
        self._local = threading.local()
        self.max_concurrency = max_concurrency
        self._pool = ThreadPoolExecutor(max_workers=max_concurrency, thread_name_prefix="rollwise-remote")
        self._ids = itertools.count()
        self._version = 0
        self._version_lock = threading.Lock()
        self.model = model or self._default_model()

    # ------------------------------------------------------------------ HTTP
    def _conn(self) -> http.client.HTTPConnection:
        c = getattr(self._local, "conn", None)
        if c is None:
            cls = http.client.HTTPSConnection if self._scheme == "https" else http.client.HTTPConnection
            c = cls(self._host, self._port, timeout=self.connect_timeout_s)
            self._local.conn = c
        return c

    def _drop_conn(self) -> None:
        c = getattr(self._local, "conn", None)
        if c is not None:
            c.close()
            self._local.conn = None

    def _request(self, method: str, path: str, body: bytes | None = None, content_type: str = "application/json",
                 timeout_s: float | None = None) -> _Response:
        """One HTTP exchange on this thread's keep-alive connection; a stale connection is retried once."""
        timeout = timeout_s or self.timeout_s
        headers = {"Content-Type": content_type} if body is not None else {}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        for attempt in (0, 1):
            conn = self._conn()
            fresh = conn.sock is None
            try:
                if fresh:
                    conn.connect()
                conn.sock.settimeout(timeout)
                conn.request(method, self._prefix + path, body=body, headers=headers)
                resp = conn.getresponse()
                data = resp.read()
                if resp.will_close:
                    self._drop_conn()
                return _Response(resp.status, data)
            except (socket.timeout, TimeoutError):
                self._drop_conn()
                raise RemoteEngineError(f"{method} {self.base_url}{path} timed out after {timeout:.0f}s") from None
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError) as e:
                self._drop_conn()
                if attempt == 0 and not fresh:  # the server closed an idle keep-alive connection: reconnect
                    continue
                raise RemoteEngineError(f"{method} {self.base_url}{path}: connection lost ({e})") from None
            except OSError as e:
                self._drop_conn()
                raise RemoteEngineError(f"{method} {self.base_url}{path}: cannot connect ({e})") from None
        raise AssertionError("unreachable")

    def _json(self, method: str, path: str, payload: Any = None, timeout_s: float | None = None) -> Any:
        body = None if payload is None else json.dumps(payload).encode()
        r = self._request(method, path, body, timeout_s=timeout_s)
        data = r.json()
        if r.status >= 400:
            raise RemoteEngineError(f"{method} {path} -> HTTP {r.status}: {_error_message(data, r.body)}")
        if data is None:
            raise RemoteEngineError(f"{method} {path} -> HTTP {r.status} with a body that is not JSON")
        return data

    def _default_model(self) -> str:
        data = self._json("GET", "/v1/models", timeout_s=min(self.timeout_s, 30.0))
        try:
            return str(data["data"][0]["id"])
        except (KeyError, IndexError, TypeError):
            raise RemoteEngineError(f"GET /v1/models returned no model: {data!r:.200}") from None

    # ------------------------------------------------------------------ the engine calls
    @property
    def weight_version(self) -> int:
        """The version of the weights last loaded through this engine (the caller's number: see `engine.protocol`);
        0 before any load."""
        return self._version

    def abort(self, request_id: str) -> RequestOutput | None:
        """`generate` is synchronous, so no request of this engine is in flight between calls: always None."""
        return None

    def health(self) -> dict[str, Any]:
        r = self._request("GET", "/health", timeout_s=min(self.timeout_s, 30.0))
        if r.status >= 400:
            raise RemoteEngineError(f"GET /health -> HTTP {r.status}: {_error_message(r.json(), r.body)}")
        data = r.json()
        return data if isinstance(data, dict) else {}

    def completion_request(self, prompt: str | list[int], sp: SamplingParams) -> dict[str, Any]:
        """The /v1/completions body for one prompt (field names as in vLLM's CompletionRequest)."""
        body: dict[str, Any] = {
            "model": self.model, "prompt": prompt, "n": sp.n, "max_tokens": sp.max_tokens,
            "temperature": sp.temperature, "top_p": sp.top_p, "ignore_eos": sp.ignore_eos,
            "logprobs": 1, "return_tokens_as_token_ids": True, "return_token_ids": True,
            "add_special_tokens": False, "skip_special_tokens": True, "stream": False,
        }
        if sp.top_k not in (-1, 0):
            body["top_k"] = sp.top_k
        if sp.seed is not None:
            body["seed"] = sp.seed
        if sp.stop:
            body["stop"] = list(sp.stop)
        if sp.stop_token_ids:
            body["stop_token_ids"] = list(sp.stop_token_ids)
        return body

    def _one(self, rid: str, prompt: str | list[int], sp: SamplingParams) -> RequestOutput:
        data = self._json("POST", "/v1/completions", self.completion_request(prompt, sp))
        return self._parse(rid, prompt, sp, data)

    def _parse(self, rid: str, prompt: str | list[int], sp: SamplingParams, data: Any) -> RequestOutput:
        try:
            choices = sorted(data["choices"], key=lambda c: c["index"])
        except (KeyError, TypeError):
            raise RemoteEngineError(f"/v1/completions response has no 'choices': {data!r:.200}") from None
        if len(choices) != sp.n:
            raise RemoteEngineError(f"/v1/completions returned {len(choices)} choices for n={sp.n}")
        top_version = data.get("weight_version")
        outs: list[CompletionOutput] = []
        prompt_ids: list[int] | None = list(prompt) if not isinstance(prompt, str) else None
        for j, ch in enumerate(choices):
            lp = ch.get("logprobs") or {}
            ids = ch.get("token_ids")
            if ids is None:
                toks = lp.get("tokens")
                if toks is None or not all(isinstance(t, str) and t.startswith("token_id:") for t in toks):
                    raise RemoteEngineError("the server returned no token ids: it must support vLLM's "
                                            "'return_token_ids' or 'return_tokens_as_token_ids'")
                ids = [int(t.split(":", 1)[1]) for t in toks]
            lps = lp.get("token_logprobs")
            if lps is None:
                raise RemoteEngineError("the server returned no log-probs for a request with logprobs=1")
            if len(lps) != len(ids):
                raise RemoteEngineError(f"choice {j}: {len(ids)} token ids but {len(lps)} log-probs")
            versions = ch.get("weight_versions")
            if not (isinstance(versions, list) and len(versions) == len(ids)):
                # Servers that don't report versions (vLLM, SGLang) serve what was last loaded through us.
                versions = [top_version if isinstance(top_version, int) else self._version] * len(ids)
            reason = ch.get("finish_reason")
            outs.append(CompletionOutput(index=j, token_ids=[int(t) for t in ids],
                                         logprobs=[float(x) if x is not None else float("nan") for x in lps],
                                         finish_reason=reason if reason in ("stop", "length", "abort") else "stop",
                                         text=ch.get("text") or "", weight_versions=[int(v) for v in versions]))
            if prompt_ids is None and isinstance(ch.get("prompt_token_ids"), list):
                prompt_ids = [int(t) for t in ch["prompt_token_ids"]]
        if prompt_ids is None:
            prompt_ids = list(self.tokenizer.encode(prompt, add_special_tokens=False)) if self.tokenizer else []
        return RequestOutput(rid, prompt_ids, outs, prompt=prompt if isinstance(prompt, str) else None)

    def generate(self, prompts: Seq[str] | Seq[list[int]] | str,
                 sampling_params: SamplingParams | Seq[SamplingParams] | None = None) -> list[RequestOutput]:
        """One RequestOutput per prompt, in order; prompts are sent concurrently. Raises RemoteEngineError."""
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]  # type: ignore[list-item]
        params = sampling_params or SamplingParams()
        plist = list(params) if isinstance(params, (list, tuple)) else [params] * len(prompts)
        if len(plist) != len(prompts):
            raise ValueError(f"{len(plist)} sampling params for {len(prompts)} prompts")
        for p in prompts:
            if not isinstance(p, str) and not (isinstance(p, list) and p and all(isinstance(t, int) for t in p)):
                raise ValueError("each prompt must be a string or a non-empty list of token ids")
        # Each request is bounded by its socket timeouts; this outer bound only guards against a stuck pool.
        waves = -(-len(prompts) // self.max_concurrency)
        deadline = time.monotonic() + waves * (self.timeout_s + self.connect_timeout_s)
        futs = [self._pool.submit(self._one, f"remote-{next(self._ids)}", p, sp) for p, sp in zip(prompts, plist)]
        outs = []
        try:
            for f in futs:
                left = deadline - time.monotonic()
                try:
                    outs.append(f.result(timeout=max(left, 0.0) + 1.0))
                except TimeoutError:
                    raise RemoteEngineError(f"generate: no answer from {self.base_url} within "
                                            f"{self.timeout_s:.0f}s") from None
        except BaseException:
            for f in futs:
                f.cancel()
            raise
        return outs

    def load_weights_from_dir(self, path: str | os.PathLike, version: int | None = None) -> int:
        """Ask the server to load the checkpoint directory `path` (a path on the server's filesystem) as
        `version` (None: current + 1); returns the new version."""
        path = str(path)
        version = self._next_version(version)
        if self.backend == "rollwise":
            data = self._json("POST", RELOAD_ROUTES["rollwise"], {"path": path, "weight_version": version})
        elif self.backend == "sglang":
            data = self._json("POST", RELOAD_ROUTES["sglang"], {"model_path": path})
            if isinstance(data, dict) and data.get("success") is False:
                raise RemoteEngineError(f"SGLang refused the weights: {data.get('message')}")
        else:
            served = self._served_root()
            if served is not None and os.path.realpath(served) != os.path.realpath(path):
                raise RemoteEngineError(f"vLLM reloads weights only from the directory it serves ({served}); write "
                                        f"the checkpoint there instead of {path}")
            data = self._json("POST", RELOAD_ROUTES["vllm"], {"method": "reload_weights"})
        return self._adopt(data, version)

    def load_weights(self, state_dict: Mapping[str, Any] | Iterable[tuple[str, Any]], version: int | None = None) -> int:
        """Send HF-named weights to the server (rollwise: as the request body; others: through a directory) as
        `version` (None: current + 1); returns the new version."""
        from safetensors.torch import save, save_file

        items = state_dict.items() if isinstance(state_dict, Mapping) else state_dict
        # clone(): safetensors refuses tensors that share storage (tied embeddings) and non-contiguous ones.
        tensors = {k: v.detach().to("cpu").contiguous().clone() for k, v in items}
        if self.backend == "rollwise" and self.weights_dir is None:
            version = self._next_version(version)
            route = f"{RELOAD_ROUTES['rollwise']}?weight_version={version}"
            r = self._request("POST", route, save(tensors), "application/octet-stream")
            data = r.json()
            if r.status >= 400:
                raise RemoteEngineError(f"POST {RELOAD_ROUTES['rollwise']} -> HTTP {r.status}: "
                                        f"{_error_message(data, r.body)}")
            return self._adopt(data, version)
        if self.backend == "vllm":
            raise RemoteEngineError("vLLM reloads only from its served directory: save the checkpoint there and call "
                                    "load_weights_from_dir(that_dir)")
        base = Path(self.weights_dir) if self.weights_dir is not None else None
        with tempfile.TemporaryDirectory(prefix="rollwise-weights-", dir=base) as d:
            save_file(tensors, os.path.join(d, "model.safetensors"))
            return self.load_weights_from_dir(d, version)

    def _next_version(self, version: int | None) -> int:
        if version is None:
            return self._version + 1
        if not isinstance(version, int) or version < 0:
            raise ValueError(f"load_weights: version must be a non-negative integer, got {version!r}")
        return version

    def _adopt(self, data: Any, version: int) -> int:
        """Record `version` after a successful reload; a rollwise server that reports another number is an error
        (its tokens would then carry versions that mean something else)."""
        served = data.get("weight_version") if isinstance(data, dict) else None
        if self.backend == "rollwise" and isinstance(served, int) and served != version:
            raise RemoteEngineError(f"the server reports weight version {served} after loading version {version}: "
                                    "it does not take the version from the request (an older rollwise serve?)")
        with self._version_lock:
            self._version = version
        return version

    def _served_root(self) -> str | None:
        try:
            d = self._json("GET", "/v1/models", timeout_s=min(self.timeout_s, 30.0))["data"][0]
            return d.get("root") or d.get("id")
        except (RemoteEngineError, KeyError, IndexError, TypeError):
            return None

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    def __enter__(self) -> "RemoteEngine":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _error_message(data: Any, raw: bytes) -> str:
    if isinstance(data, dict):
        err = data.get("error")
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])
        for k in ("message", "detail"):
            if data.get(k):
                return str(data[k])
    return raw[:200].decode("utf-8", "replace") or "(empty body)"


class MultiEngine:
    """Several engines (local `LLM`s, `RemoteEngine`s, any mix) behind the same calls.

    `generate` splits the prompts into contiguous shares, one per engine in proportion to `weights`, runs
    the engines concurrently (one thread each) and returns the outputs in the prompts' order. `load_weights`
    sends the same weights to every engine, so their weight versions advance together.
    """

    def __init__(self, engines: Seq[Any], weights: Seq[float] | None = None) -> None:
        if not engines:
            raise ValueError("MultiEngine needs at least one engine")
        for e in engines:
            if not callable(getattr(e, "generate", None)) or not callable(getattr(e, "load_weights", None)):
                raise TypeError(f"{type(e).__name__} is not an engine: it needs generate() and load_weights()")
        w = list(weights) if weights is not None else [1.0] * len(engines)
        if len(w) != len(engines) or any(x < 0 for x in w) or sum(w) <= 0:
            raise ValueError("weights must be one non-negative number per engine, not all zero")
        self.engines = list(engines)
        self.weights = w
        self._pool = ThreadPoolExecutor(max_workers=len(engines), thread_name_prefix="rollwise-multi")

    @property
    def tokenizer(self) -> Any:
        return next((t for t in (getattr(e, "tokenizer", None) for e in self.engines) if t is not None), None)

    @property
    def weight_version(self) -> int:
        """The oldest weight version among the engines (every engine has at least these weights)."""
        return min(e.weight_version for e in self.engines)

    def split(self, num_prompts: int) -> list[tuple[int, int]]:
        """[start, end) prompt ranges per engine: proportional to `weights`, largest remainders first."""
        total = sum(self.weights)
        exact = [num_prompts * x / total for x in self.weights]
        counts = [int(q) for q in exact]
        order = sorted(range(len(exact)), key=lambda i: exact[i] - counts[i], reverse=True)
        for i in order[: num_prompts - sum(counts)]:
            counts[i] += 1
        bounds, start = [], 0
        for c in counts:
            bounds.append((start, start + c))
            start += c
        return bounds

    def generate(self, prompts: Seq[str] | Seq[list[int]] | str,
                 sampling_params: SamplingParams | Seq[SamplingParams] | None = None) -> list[RequestOutput]:
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]  # type: ignore[list-item]
        prompts = list(prompts)
        params = sampling_params or SamplingParams()
        plist = list(params) if isinstance(params, (list, tuple)) else [params] * len(prompts)
        if len(plist) != len(prompts):
            raise ValueError(f"{len(plist)} sampling params for {len(prompts)} prompts")
        jobs = []
        for eng, (a, b) in zip(self.engines, self.split(len(prompts))):
            if b > a:
                jobs.append(self._pool.submit(eng.generate, prompts[a:b], plist[a:b]))
        outs: list[RequestOutput] = []
        for j in jobs:
            outs.extend(j.result())
        return outs

    def load_weights(self, state_dict: Mapping[str, Any], version: int | None = None) -> int:
        """Load the same weights into every engine (concurrently) as `version` (None: the oldest engine's + 1), so
        their versions agree; returns it."""
        sd = dict(state_dict) if not isinstance(state_dict, Mapping) else state_dict
        v = self.weight_version + 1 if version is None else version
        for f in [self._pool.submit(e.load_weights, sd, v) for e in self.engines]:
            f.result()
        return v

    def abort(self, request_id: str) -> RequestOutput | None:
        """Generation is split into synchronous per-engine calls: no request is in flight between calls."""
        return None

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        for e in self.engines:
            if callable(getattr(e, "close", None)):
                e.close()
