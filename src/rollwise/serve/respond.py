"""Answering one generation request: wait on the engine thread's events, shape JSON or an SSE stream.

Split from app.py so the HTTP plumbing and the response shapes read separately. `h` is the HTTP handler
(app._Handler): this module uses its socket-level helpers (`_client_gone`, `_send_json`, `wfile`) only.

NOTE on streamed text: a sample's text is re-decoded from all its tokens at every step (exact, and what
the engine's stop-string check sees). Up to (longest stop string - 1) characters, and a trailing U+FFFD of
an unfinished UTF-8 character, are held back until the sample ends, so text already sent never has to be
taken back when a stop string cuts it.
"""

from __future__ import annotations

import json
import queue
from typing import Any

from rollwise.serve.protocol import APIError, GenerationRequest, chat_logprobs, completion_logprobs, stop_reason, usage
from rollwise.serve.worker import Event
from rollwise.types import CompletionOutput, RequestOutput


class GenerationRun:
    """One generation request in flight: waits on engine events, shapes JSON or SSE responses."""

    def __init__(self, h: Any, req: GenerationRequest, chat: bool, rids: list[str], prompt_ids: list[list[int]],
                 params: list[Any], events: "queue.Queue[Event]") -> None:
        self.h, self.app, self.req, self.chat = h, h.app, req, chat
        self.rids, self.prompt_ids, self.params, self.events = rids, prompt_ids, params, events
        self.index = {rid: i for i, rid in enumerate(rids)}
        self.pending = set(rids)
        self.n = req.params.n
        kind = "chatcmpl" if chat else "cmpl"
        self.id = f"{kind}-{req.request_id}"

    def _abort_all(self) -> None:
        for rid in self.pending:
            self.app.worker.abort(rid)

    def _next(self) -> Event | None:
        """The next engine event; None when the client hung up (its requests are then aborted)."""
        while True:
            try:
                return self.events.get(timeout=self.app.config.disconnect_poll_s)
            except queue.Empty:
                if self.h._client_gone():
                    self._abort_all()
                    self.h.close_connection = True
                    return None

    def _version(self, outs: list[RequestOutput]) -> int:
        vs = [v for o in outs for c in o.outputs for v in c.weight_versions[-1:]]
        return max(vs) if vs else self.app.engine.weight_version

    # ------------------------------------------------------------------ non-streaming
    def respond(self) -> None:
        done: dict[str, RequestOutput] = {}
        while self.pending:
            ev = self._next()
            if ev is None:
                return
            if ev.kind == "error":
                self.pending.discard(ev.request_id)
                self._abort_all()
                raise ev.error  # type: ignore[misc]
            if ev.kind == "final":
                self.pending.discard(ev.request_id)
                if ev.output is None:
                    self._abort_all()
                    raise APIError(500, f"request {ev.request_id} ended without output")
                done[ev.request_id] = ev.output
        outs = [done[rid] for rid in self.rids]
        choices = []
        for i, out in enumerate(outs):
            for c in out.outputs:
                choices.append(self._choice(i, c, out))
        n_prompt = sum(len(p) for p in self.prompt_ids)
        n_out = sum(len(c.token_ids) for o in outs for c in o.outputs)
        body = {"id": self.id, "object": "chat.completion" if self.chat else "text_completion",
                "created": self.req.created, "model": self.req.model, "choices": choices,
                "usage": usage(n_prompt, n_out), "weight_version": self._version(outs)}
        self.h._send_json(200, body)

    def _choice(self, i: int, c: CompletionOutput, out: RequestOutput) -> dict[str, Any]:
        req, app = self.req, self.app
        params = self.params[i]
        full = app.full_text(c.token_ids) if params.stop else None
        ch: dict[str, Any] = {"index": i * self.n + c.index}
        if self.chat:
            ch["message"] = {"role": "assistant", "content": c.text}
        else:
            ch["text"] = c.text
        ch["logprobs"] = self._logprobs(c.token_ids, c.logprobs, 0) if req.logprobs is not None else None
        ch["finish_reason"] = c.finish_reason
        ch["stop_reason"] = stop_reason(c, params, full, app.engine.eos_token_ids)
        if req.return_token_ids:
            ch["token_ids"] = list(c.token_ids)
            ch["prompt_token_ids"] = list(out.prompt_token_ids)
            ch["weight_versions"] = list(c.weight_versions)
        return ch

    def _logprobs(self, ids: list[int], lps: list[float], offset0: int) -> dict[str, Any]:
        k = self.req.logprobs or 0
        as_ids = self.req.return_tokens_as_token_ids or self.app.tokenizer is None
        names, texts = self.app.pieces(ids)
        if self.chat:
            return chat_logprobs(ids, lps, names, k, as_ids)
        return completion_logprobs(ids, lps, names, k, as_ids, offset0, texts)

    # ------------------------------------------------------------------ streaming (SSE)
    def stream(self) -> None:
        h = self.h
        h.close_connection = True  # the stream ends when we close: no Content-Length
        h.send_response(200)
        h.send_header("Content-Type", "text/event-stream")
        h.send_header("Cache-Control", "no-cache")
        h.send_header("Connection", "close")
        h.end_headers()
        n_choices = len(self.rids) * self.n
        sent_tok = [0] * n_choices
        sent_txt = [0] * n_choices
        sent_off = [0] * n_choices
        started = [False] * n_choices
        ended = [False] * n_choices
        hold = max((len(s) for s in self.req.params.stop or []), default=1) - 1
        final: dict[str, RequestOutput] = {}
        try:
            while self.pending:
                ev = self._next()
                if ev is None:
                    return
                if ev.kind == "error":
                    self.pending.discard(ev.request_id)
                    self._abort_all()
                    self._write({"error": ev.error.to_json()["error"]})  # type: ignore[union-attr]
                    break
                out = ev.output
                if ev.kind == "final":
                    self.pending.discard(ev.request_id)
                    if out is None:
                        continue
                    final[ev.request_id] = out
                i = self.index[ev.request_id]
                for c in out.outputs:  # type: ignore[union-attr]
                    k = i * self.n + c.index
                    if ended[k]:
                        continue
                    new_ids = c.token_ids[sent_tok[k]:]
                    new_lps = c.logprobs[sent_tok[k]:]
                    if c.finish_reason is None:
                        stable = len(c.text) - hold
                        while stable > sent_txt[k] and c.text[stable - 1] == "\ufffd":
                            stable -= 1  # an incomplete UTF-8 character: wait for the rest
                        new_text = c.text[sent_txt[k]:stable] if stable > sent_txt[k] else ""
                    else:
                        new_text = c.text[sent_txt[k]:]
                    if not new_ids and not new_text and c.finish_reason is None:
                        continue
                    chunk = self._chunk(k, i, c, new_ids, new_lps, new_text, sent_off[k], not started[k])
                    started[k] = True
                    ended[k] = c.finish_reason is not None
                    self._write(chunk)
                    sent_tok[k] += len(new_ids)
                    sent_txt[k] += len(new_text)
                    sent_off[k] += sum(len(p) for p in self.app.pieces(new_ids)[1]) if self.req.logprobs is not None else 0
            if self.req.include_usage and final:
                outs = list(final.values())
                n_out = sum(len(c.token_ids) for o in outs for c in o.outputs)
                self._write({"id": self.id, "object": self._obj, "created": self.req.created, "model": self.req.model,
                             "choices": [], "usage": usage(sum(len(p) for p in self.prompt_ids), n_out)})
            h.wfile.write(b"data: [DONE]\n\n")
            h.wfile.flush()
        except OSError:  # the client hung up, or stopped reading for write_timeout_s (TimeoutError)
            self._abort_all()
            h.close_connection = True

    @property
    def _obj(self) -> str:
        return "chat.completion.chunk" if self.chat else "text_completion"

    def _chunk(self, k: int, i: int, c: CompletionOutput, ids: list[int], lps: list[float], text: str, off: int,
               first: bool) -> dict[str, Any]:
        ch: dict[str, Any] = {"index": k}
        if self.chat:
            delta: dict[str, Any] = {"content": text}
            if first:
                delta["role"] = "assistant"
            ch["delta"] = delta
        else:
            ch["text"] = text
        ch["logprobs"] = self._logprobs(ids, lps, off) if self.req.logprobs is not None and ids else None
        ch["finish_reason"] = c.finish_reason
        if c.finish_reason is not None:
            full = self.app.full_text(c.token_ids) if self.params[i].stop else None
            ch["stop_reason"] = stop_reason(c, self.params[i], full, self.app.engine.eos_token_ids)
        if self.req.return_token_ids:  # as vLLM: prompt ids in a choice's first chunk, then token deltas
            if first:
                ch["prompt_token_ids"] = list(self.prompt_ids[i])
            ch["token_ids"] = list(ids)
            ch["weight_versions"] = list(c.weight_versions[len(c.token_ids) - len(ids):])
        return {"id": self.id, "object": self._obj, "created": self.req.created, "model": self.req.model,
                "choices": [ch], "weight_version": c.weight_versions[-1] if c.weight_versions else
                self.app.engine.weight_version}

    def _write(self, obj: Any) -> None:
        self.h.wfile.write(b"data: " + json.dumps(obj, allow_nan=False).encode() + b"\n\n")
        self.h.wfile.flush()
