"""Remote engines: the in-process `LLM` calls over HTTP, and a `MultiEngine` that mixes engines in one run.

`RemoteEngine` speaks the OpenAI-compatible completions API of `rollwise serve`, vLLM or SGLang. Token in,
token out: prompts go as token ids, and the exact sampled token ids come back through vLLM's extensions
(`return_token_ids` adds `token_ids` to each choice; `return_tokens_as_token_ids` spells log-prob tokens as
`token_id:N`), never by re-tokenizing text. Each prompt is one HTTP request, sent concurrently from a thread
pool, so the server's continuous batch sees them all at once.

Nothing the server says is trusted (`clients.remote_check`): ids, log-probs, lengths and versions are validated,
the text that is scored is decoded here from the ids, and every request has a total deadline
(`clients.http_client`). Weights reach the server through the strategy for its kind (`clients.weight_sync`),
chosen when the engine is built. `stepwise()` gives the step-level interface over streaming requests
(`clients.remote_stream`), which the early_stop and partial policies drive.

Against vLLM, start it with `--logprobs-mode processed_logprobs`: its default reports log-probs before
temperature, not the sampling distribution's (`run.sync_check` refuses a server whose log-probs differ).

Deliberately left out: retries of generation requests (a failed request raises; the caller decides).
"""

from __future__ import annotations

import itertools
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping, Sequence as Seq, cast

from rollwise.clients.http_client import HttpClient
from rollwise.engine.protocol import Engine, params_list, prompt_list
from rollwise.clients.remote_check import ChoiceLimits, RemoteEngineError, TextTally, ordered_choices, parse_choice
from rollwise.clients.weight_sync import (SERVER_KINDS, AdapterSource, ServerSync, SyncChoice, SyncReport,
                                          make_server_sync)
from rollwise.types import CompletionOutput, RequestOutput, SamplingParams, Tokenizer

if TYPE_CHECKING:  # pragma: no cover
    from rollwise.clients.remote_stream import MultiStepEngine, RemoteStepEngine

__all__ = ["Engine", "MultiEngine", "RemoteEngine", "RemoteEngineError", "SERVER_KINDS"]


class RemoteEngine:
    """The `LLM` calls (`generate`, `load_weights`, `weight_version`, `tokenizer`) against an HTTP server.

    >>> eng = RemoteEngine("http://127.0.0.1:8000", api_key="ADMIN_KEY")
    >>> outs = eng.generate([[5, 6, 7]], SamplingParams(n=4, max_tokens=32, seed=0))
    """

    tokenizer: Tokenizer | None

    def __init__(self, base_url: str, model: str | None = None, api_key: str | None = None, timeout_s: float = 600.0,
                 backend: str = "rollwise", max_concurrency: int = 64, tokenizer: Tokenizer | None = None,
                 weights_dir: str | os.PathLike[str] | None = None, connect_timeout_s: float = 10.0,
                 vocab_size: int | None = None, sync: ServerSync | None = None, lora_adapters: bool = False) -> None:
        """
        base_url: the server root, e.g. http://127.0.0.1:8000 (a trailing /v1 is accepted).
        model: the served model name; default: the first entry of GET /v1/models.
        api_key: the servers' admin key, sent as `Authorization: Bearer KEY` on the weight-sync routes only (the
            admin routes: rollwise serve's /admin/*, vLLM's pause / RPC / version routes, SGLang's reload), never
            with a completion, a model list or a health check, which any server on the URL may read.
        timeout_s: the longest one generation or weight-load request may take, in total (not per read).
        backend: "rollwise", "vllm" or "sglang": which weight-sync strategy (`clients.weight_sync`) to use.
        tokenizer: decodes the text of every sample from its token ids (the server's text is not used), and
            tokenizes string prompts when the server does not return their ids.
        weights_dir: vllm/sglang: where weight syncs write their safetensors (a directory the server can read;
            default a temporary directory on this machine).
        vocab_size: token ids must be below this (default: the tokenizer's length).
        sync: how weights reach the server, as `clients.weight_sync.make_server_sync` chose it for this server
            (a run builds it from its config, NCCL transfer included); default: the disk strategy of `backend`
            (`SyncChoice(backend, weights_dir, lora_adapters=...)`).
        lora_adapters: vLLM with LoRA on: syncs send the trainer's LoRA adapter (`bind_trainer` gives it), not
            merged weights.
        """
        if backend not in SERVER_KINDS:
            raise ValueError(f"backend must be one of {', '.join(SERVER_KINDS)}, got {backend!r}")
        if timeout_s <= 0 or max_concurrency < 1:
            raise ValueError("timeout_s must be > 0 and max_concurrency >= 1")
        self.http = HttpClient(base_url, connect_timeout_s=connect_timeout_s)
        self.admin_http = HttpClient(base_url, api_key=api_key, connect_timeout_s=connect_timeout_s)
        """The weight syncs' client: the same server, with the admin key."""
        self.base_url = self.http.base_url
        self.api_key = api_key
        self.timeout_s = float(timeout_s)
        self.backend = backend
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size if vocab_size is not None else (len(tokenizer) if tokenizer is not None else None)
        self.max_concurrency = max_concurrency
        self._pool = ThreadPoolExecutor(max_workers=max_concurrency, thread_name_prefix="rollwise-remote")
        self._ids = itertools.count()
        self._version = 0
        self._version_lock = threading.Lock()
        self._sync = sync if sync is not None else make_server_sync(SyncChoice(backend, weights_dir,
                                                                               lora_adapters=lora_adapters))
        self.last_sync: SyncReport | None = None
        self.texts = TextTally()
        """Samples whose server text disagreed with their ids (`counters()['text_mismatch']`)."""
        self.model = model or self._default_model()

    # ------------------------------------------------------------------ plumbing
    def _json(self, method: str, path: str, payload: Any = None, timeout_s: float | None = None) -> Any:
        return self.http.json(method, path, payload, deadline_s=timeout_s or self.timeout_s)

    def _default_model(self) -> str:
        data = self._json("GET", "/v1/models", timeout_s=min(self.timeout_s, 30.0))
        try:
            return str(data["data"][0]["id"])
        except (KeyError, IndexError, TypeError):
            raise RemoteEngineError(f"GET {self.base_url}/v1/models returned no model: {data!r:.200}") from None

    def decode(self, ids: list[int], stop: Seq[str] | None = None) -> str:
        """The text of `ids` as rollwise's engine makes it (special tokens skipped, cut before a stop string)."""
        if self.tokenizer is None:
            return ""
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        cuts = [i for i in (text.find(s) for s in stop or []) if i >= 0]
        return text[: min(cuts)] if cuts else text

    def limits(self, sp: SamplingParams, version_floor: int) -> ChoiceLimits:
        return ChoiceLimits(max_tokens=sp.max_tokens, vocab_size=self.vocab_size,
                            versions=(min(version_floor, self._version), self._version))

    # ------------------------------------------------------------------ the engine calls
    @property
    def weight_version(self) -> int:
        """The version of the weights last loaded through this engine (the caller's number: see `engine.protocol`);
        0 before any load."""
        return self._version

    def counters(self) -> dict[str, int]:
        """`text_mismatch`: samples so far whose text (as the server reported it) disagreed with their token ids;
        a server's failures surface as errors of the call that met them."""
        return {"text_mismatch": self.texts.mismatched}

    def abort(self, request_id: str) -> RequestOutput | None:
        """`generate` is synchronous, so no request of this engine is in flight between calls: always None."""
        return None

    def health(self) -> dict[str, Any]:
        r = self.http.request("GET", "/health", deadline_s=min(self.timeout_s, 30.0))
        if r.status >= 400:
            raise RemoteEngineError(f"GET {self.base_url}/health -> HTTP {r.status}")
        data = r.json()
        return data if isinstance(data, dict) else {}

    def completion_request(self, prompt: str | list[int], sp: SamplingParams, stream: bool = False) -> dict[str, Any]:
        """The /v1/completions body for one prompt (field names as in vLLM's CompletionRequest)."""
        body: dict[str, Any] = {
            "model": self.model, "prompt": prompt, "n": sp.n, "max_tokens": sp.max_tokens,
            "temperature": sp.temperature, "top_p": sp.top_p, "ignore_eos": sp.ignore_eos,
            "logprobs": 1, "return_tokens_as_token_ids": True, "return_token_ids": True,
            "add_special_tokens": False, "skip_special_tokens": True, "stream": stream,
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
        floor = self._version
        data = self._json("POST", "/v1/completions", self.completion_request(prompt, sp))
        try:
            return self._parse(rid, prompt, sp, data, floor)
        except RemoteEngineError as e:
            raise RemoteEngineError(f"{self.base_url}/v1/completions: {e}") from None

    def _parse(self, rid: str, prompt: str | list[int], sp: SamplingParams, data: Any, floor: int) -> RequestOutput:
        choices = ordered_choices(data, sp.n)
        limits = self.limits(sp, floor)
        top = data.get("weight_version")
        decode: Callable[[list[int]], str] | None = (lambda ids: self.decode(ids, sp.stop)) if self.tokenizer else None
        outs: list[CompletionOutput] = []
        prompt_ids: list[int] | None = list(prompt) if not isinstance(prompt, str) else None
        said: list[tuple[Any, str]] = []
        for j, ch in enumerate(choices):
            out = parse_choice(ch, j, top, limits, decode)
            if decode is None:  # no tokenizer to decode with: the server's text is all there is
                out.text = ch.get("text") if isinstance(ch.get("text"), str) else ""
            else:
                said.append((ch.get("text"), out.text))
            outs.append(out)
            if prompt_ids is None and isinstance(ch.get("prompt_token_ids"), list):
                prompt_ids = [int(t) for t in ch["prompt_token_ids"]]
        self.texts.add(said)
        if prompt_ids is None:  # a string prompt whose ids the server did not return
            tok = self.tokenizer
            prompt_ids = list(tok.encode(prompt, add_special_tokens=False)) if tok and isinstance(prompt, str) else []
        return RequestOutput(rid, prompt_ids, outs, prompt=prompt if isinstance(prompt, str) else None)

    def generate(self, prompts: Seq[str] | Seq[list[int]] | str,
                 sampling_params: SamplingParams | Seq[SamplingParams] | None = None) -> list[RequestOutput]:
        """One RequestOutput per prompt, in order; prompts are sent concurrently. Raises RemoteEngineError."""
        batch = prompt_list(prompts)
        plist = params_list(sampling_params, len(batch))
        for p in batch:
            if not isinstance(p, str) and not (isinstance(p, list) and p and all(isinstance(t, int) for t in p)):
                raise ValueError("each prompt must be a string or a non-empty list of token ids")
        futs = [self._pool.submit(self._one, f"remote-{next(self._ids)}", p, sp) for p, sp in zip(batch, plist)]
        try:
            return [f.result() for f in futs]  # each request is bounded by its own total deadline
        except BaseException:
            for f in futs:
                f.cancel()
            raise

    def stepwise(self) -> RemoteStepEngine:
        """The step-level engine over streaming requests (add_request / step / abort), for early_stop and partial."""
        from rollwise.clients.remote_stream import RemoteStepEngine

        return RemoteStepEngine(self)

    def load_weights_from_dir(self, path: str | os.PathLike[str], version: int | None = None) -> int:
        """Ask the server to load the checkpoint directory `path` (a path on the server's filesystem) as
        `version` (None: current + 1); returns the new version."""
        version = self._next_version(version)
        return self._adopt(self._sync.push_dir(self.admin_http, str(path), version, self.timeout_s))

    def load_weights(self, state_dict: Mapping[str, Any] | Iterable[tuple[str, Any]], version: int | None = None) -> int:
        """Send HF-named weights to the server through its sync strategy as `version` (None: current + 1);
        returns the new version."""
        version = self._next_version(version)
        state = state_dict if isinstance(state_dict, Mapping) else dict(state_dict)
        return self._adopt(self._sync.push(self.admin_http, state, version, self.timeout_s))

    def _next_version(self, version: int | None) -> int:
        if version is None:
            return self._version + 1
        if isinstance(version, bool) or not isinstance(version, int) or version < 0:
            raise ValueError(f"load_weights: version must be a non-negative integer, got {version!r}")
        return version

    def _adopt(self, rep: SyncReport) -> int:
        with self._version_lock:
            self._version = rep.version
            if isinstance(rep.detail.get("model"), str):  # a LoRA adapter sync: requests now name the adapter
                self.model = rep.detail["model"]
        self.last_sync = rep
        return rep.version

    def bind_trainer(self, trainer: AdapterSource) -> None:
        """Give the sync strategy the trainer it takes weights from directly (LoRA adapters); a no-op otherwise."""
        bind = getattr(self._sync, "bind_trainer", None)
        if callable(bind):
            bind(trainer)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._sync.close()

    def __enter__(self) -> "RemoteEngine":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class MultiEngine:
    """Several engines (local `LLM`s, `RemoteEngine`s, any mix) behind the same calls.

    `generate` splits the prompts into contiguous shares, one per engine in proportion to `weights`, runs
    the engines concurrently (one thread each) and returns the outputs in the prompts' order. `load_weights`
    sends the same weights to every engine, so their weight versions advance together.
    """

    def __init__(self, engines: Seq[Engine], weights: Seq[float] | None = None) -> None:
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
    def tokenizer(self) -> Tokenizer | None:
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
        batch = prompt_list(prompts)
        plist = params_list(sampling_params, len(batch))
        jobs = []
        for eng, (a, b) in zip(self.engines, self.split(len(batch))):
            if b > a:
                share = cast("Seq[str] | Seq[list[int]]", batch[a:b])  # a slice of the caller's own prompts
                jobs.append(self._pool.submit(eng.generate, share, plist[a:b]))
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

    def counters(self) -> dict[str, int]:
        """Each count summed over the servers."""
        out: dict[str, int] = {}
        for e in self.engines:
            for k, v in e.counters().items():
                out[k] = out.get(k, 0) + v
        return out

    def abort(self, request_id: str) -> RequestOutput | None:
        """Generation is split into synchronous per-engine calls: no request is in flight between calls."""
        return None

    def bind_trainer(self, trainer: AdapterSource) -> None:
        for e in self.engines:
            bind = getattr(e, "bind_trainer", None)  # only engines whose weight sync reads the trainer have it
            if callable(bind):
                bind(trainer)

    def stepwise(self) -> MultiStepEngine:
        """The step-level engine over every engine's streaming requests (remote engines only)."""
        from rollwise.clients.remote_stream import MultiStepEngine

        remotes = [e for e in self.engines if isinstance(e, RemoteEngine)]
        if len(remotes) != len(self.engines):
            raise ValueError("early_stop and partial over several engines need every one to be a remote engine")
        return MultiStepEngine(remotes)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        for e in self.engines:
            close = getattr(e, "close", None)  # not part of the engine protocol: an in-process LLM has none
            if callable(close):
                close()


if TYPE_CHECKING:  # pragma: no cover - read by mypy only: both classes must keep implementing the engine protocol
    def _implements_engine(remote: RemoteEngine, multi: MultiEngine) -> list[Engine]:
        return [remote, multi]
