"""EngineCore: the step-level engine API (add request, step, abort, interrupt, load weights).

`step()` is the whole engine loop in three lines: schedule -> run -> update. Everything else is
bookkeeping of requests around it. `LLM.generate` (llm.py) is a batch loop over this API; the rollout
controller drives it directly to refill slots, stop early and carry partial samples across updates.
"""

from __future__ import annotations

import json
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Mapping

import torch

from rollwise.config import EngineConfig  # the one definition of the engine knobs; the sizing fields are read here
from rollwise.engine.block_manager import BlockManager
from rollwise.engine.model_runner import ModelRunner, engine_precision, kv_cache_dtype
from rollwise.engine.scheduler import Scheduler, SchedulerConfig
from rollwise.engine.sequence import Sequence, SeqStatus
from rollwise.engine.speculative import DraftSpec, RequestDrafter, SpecStats, StepCost, accepted_prefix
from rollwise.engine.tree import TreeState, entropy
from rollwise.models.decoder import DecoderLM
from rollwise.models.convert import resolve_model
from rollwise.models.loader import WeightMapper, load_model
from rollwise.types import CompletionOutput, FinishReason, RequestOutput, SamplingParams, Tokenizer

_MASK63 = (1 << 63) - 1


def default_engine_config() -> EngineConfig:
    """The engine section's defaults (the run config's and `LLM`'s).

    Built through `model_validate`, not `EngineConfig()`: mypy, without pydantic's plugin, reads a field declared
    `Field(default, ge=...)` as required, and the two are the same object."""
    return EngineConfig.model_validate({})


def sample_seed(seed: int, index: int) -> int:
    """Per-sample 63-bit seed from a request seed and the sample index (splitmix64 finaliser)."""
    z = (seed * 0x9E3779B97F4A7C15 + (index + 1) * 0xBF58476D1CE4E5B9) & ((1 << 64) - 1)
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & ((1 << 64) - 1)
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & ((1 << 64) - 1)
    return (z ^ (z >> 31)) & _MASK63


@dataclass
class _Request:
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    seqs: list[Sequence | None]  # None where a resumed sample was already finished
    done_outputs: dict[int, CompletionOutput] = field(default_factory=dict)
    arrival: float = field(default_factory=time.perf_counter)
    tree: TreeState | None = None


@dataclass
class EngineStats:
    steps: int = 0
    prefill_steps: int = 0
    prefill_tokens: int = 0
    decode_tokens: int = 0  # rows of decode steps (one per sequence, plus verified draft tokens)
    tree_forks: int = 0  # tree rollouts: samples forked mid-generation (their first token cost no row)
    tree_copies: int = 0  # tree rollouts: samples whose parent ended before their branch point
    busy_s: float = 0.0
    spec: SpecStats = field(default_factory=SpecStats)


class EngineCore:
    def __init__(self, model: DecoderLM, hf_config: object, tokenizer: Tokenizer | None = None,
                 config: EngineConfig | None = None, device: str | torch.device = "cpu", seed: int = 0,
                 linear_kind: str | None = None) -> None:
        """hf_config: the checkpoint's config (read for its limits and EOS ids). seed: seeds the per-sample seeds of
        requests submitted without one. linear_kind: the CPU linear-weight format (`model_runner.engine_precision`;
        None = F.linear on the parameters)."""
        self.config = config or default_engine_config()
        self.model = model
        self.hf_config = hf_config
        self.tokenizer = tokenizer
        self.device = torch.device(device)
        cfg = self.config
        max_len = cfg.max_model_len or min(getattr(hf_config, "max_position_embeddings", 4096), 4096)
        self.max_model_len = min(max_len, model.cos_cached.shape[0])
        kv_dtype = kv_cache_dtype(cfg.kv_cache_dtype, model.embed_tokens.weight.dtype, linear_kind)
        per_block = ModelRunner.kv_bytes_per_block(model.spec, cfg.block_size, kv_dtype)
        if cfg.num_kv_blocks is not None:
            num_blocks = cfg.num_kv_blocks
        else:
            want = cfg.max_num_seqs * -(-self.max_model_len // cfg.block_size)
            num_blocks = max(1, min(want, int(cfg.kv_cache_gb * 2**30) // per_block))
        self.block_manager = BlockManager(num_blocks, cfg.block_size, cfg.enable_prefix_caching)
        self.scheduler = Scheduler(
            SchedulerConfig(cfg.max_num_seqs, cfg.max_num_batched_tokens, self.max_model_len), self.block_manager
        )
        self.runner = ModelRunner(model, num_blocks, cfg.block_size, self.device, cfg.logprobs_mode, linear_kind,
                                  kv_dtype)
        self.eos_token_ids = frozenset(_eos_ids(hf_config, tokenizer))
        self.weight_version = 0
        self.requests: dict[str, _Request] = {}
        self.stats = EngineStats()
        self._rng = random.Random(seed)
        self._mapper = WeightMapper(model)
        self._touched: set[str] = set()  # requests with a sample that finished since the last collect
        # Speculation: when True, fit the decode step's cost per row online (engine/speculative.py StepCost) and let
        # the draft-length rule use it. Off by default: the fit depends on wall-clock time, so batch shapes (and with
        # them float rounding) would vary from run to run; the pinned `scheduler.config.spec_overhead_rows` keeps
        # "same seed, same drafts, same output" exact.
        self.calibrate_spec = False
        self._step_cost = StepCost(self.scheduler.config.spec_overhead_rows)

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_pretrained(cls, model_dir: str | Path, device: str = "cpu", dtype: str = "float32",
                        config: EngineConfig | None = None, tokenizer: Tokenizer | None = None,
                        seed: int = 0) -> "EngineCore":
        config = config or default_engine_config()
        dev = torch.device(device)
        if dev.type == "cuda" and not torch.cuda.is_available():
            raise ValueError("device 'cuda' requested but CUDA is not available")
        max_len = config.max_model_len or 4096
        model_dir = resolve_model(model_dir)  # a checkpoint dir, a .gguf file, a known name or a hub id
        param_dtype, linear_kind = engine_precision(dtype, dev)
        model, hf_config = load_model(model_dir, param_dtype, dev, max_len)
        if tokenizer is None:
            tokenizer = load_tokenizer(model_dir)
        return cls(model, hf_config, tokenizer, config, dev, seed=seed, linear_kind=linear_kind)

    # ------------------------------------------------------------------ requests
    def add_request(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
                    partial: list[CompletionOutput] | None = None,
                    drafts: DraftSpec | list[list[int]] | None = None) -> None:
        """Queue a request. `partial` resumes aborted samples: sample j continues from partial[j]'s tokens
        (its log-probs and weight versions are kept; new tokens get the current weight version).

        `drafts` turns on speculative decoding for the request (engine/speculative.py): a list of past
        continuations of this prompt (token ids; may be empty: n-gram drafts only), or a `DraftSpec` (also
        setting the draft length k and the n-gram source). The output distribution is unchanged."""
        if request_id in self.requests:
            raise ValueError(f"duplicate request id {request_id!r}")
        if not prompt_token_ids:
            raise ValueError(f"request {request_id!r} has an empty prompt")
        vocab = self.model.spec.vocab_size
        if min(prompt_token_ids) < 0 or max(prompt_token_ids) >= vocab:
            raise ValueError(f"request {request_id!r} has token ids outside the vocabulary [0, {vocab})")
        try:
            spec = DraftSpec.make(drafts)
            if spec is not None:
                spec.check_vocab(vocab)
        except ValueError as e:
            raise ValueError(f"request {request_id!r}: {e}") from None
        drafter = RequestDrafter(list(prompt_token_ids), spec) if spec is not None else None
        if params.tree is not None:
            why = ("speculative drafts" if spec is not None else "resumed partial samples" if partial is not None
                   else "greedy sampling (temperature 0: every branch would be the same)"
                   if params.temperature <= 0 else None)
            if why is not None:
                raise ValueError(f"request {request_id!r}: tree sampling does not combine with {why}")
        if partial is not None and len(partial) != params.n:
            raise ValueError(f"request {request_id!r}: partial has {len(partial)} samples, params.n={params.n}")
        base = params.seed if params.seed is not None else None
        req = _Request(request_id, list(prompt_token_ids), params, [])
        seqs: list[Sequence] = []
        for j in range(params.n):
            seed = sample_seed(base, j) if base is not None else self._rng.getrandbits(63)
            prev = partial[j] if partial is not None else None
            if prev is not None and prev.finish_reason in ("stop", "length"):
                req.seqs.append(None)
                req.done_outputs[j] = prev
                continue
            seq = Sequence(request_id, j, list(prompt_token_ids), len(prompt_token_ids), params, seed,
                           self.eos_token_ids)
            if prev is not None and prev.token_ids:
                seq.token_ids.extend(prev.token_ids)
                seq.output_logprobs.extend(prev.logprobs)
                seq.output_weight_versions.extend(prev.weight_versions or [self.weight_version] * len(prev.token_ids))
            if drafter is not None:
                seq.spec = drafter.attach(seq, j)
            req.seqs.append(seq)
            seqs.append(seq)
        self.requests[request_id] = req
        if not seqs:  # every sample was already finished: hand it back at the next step
            self._touched.add(request_id)
            return
        if params.tree is not None:
            req.tree = TreeState.plan(params.tree, seqs)
            roots = req.tree.roots
            roots[0].pending_forks = roots[1:]
            to_add = [roots[0]]
        elif partial is None and len(seqs) > 1:
            seqs[0].pending_forks = seqs[1:]
            to_add = [seqs[0]]
        else:
            to_add = seqs
        try:
            for s in to_add:
                self.scheduler.add(s)
        except ValueError as e:
            for s in to_add:
                if s.status is SeqStatus.WAITING and s in self.scheduler.waiting:
                    self.scheduler.waiting.remove(s)
            del self.requests[request_id]
            raise ValueError(f"request {request_id!r}: {e}") from None

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    @property
    def num_unfinished_requests(self) -> int:
        return len(self.requests)

    # ------------------------------------------------------------------ the loop
    def step(self) -> list[RequestOutput]:
        """One forward pass: schedule -> run -> update. Returns the requests that finished in it."""
        t0 = time.perf_counter()
        sched = self.scheduler.schedule()
        if sched is None:
            return self._collect_finished()
        result = self.runner.execute(sched, self._branch if any(s.tree is not None for s in sched.sample_seqs) else None)
        if sched.drafts is None:
            emitted = self._update(sched, result.token_ids, result.logprobs)
        else:
            emitted = self._update_verified(sched, result.token_ids, result.logprobs)
        st = self.stats
        st.steps += 1
        dt = time.perf_counter() - t0
        if sched.is_prefill:
            st.prefill_steps += 1
            st.prefill_tokens += sched.num_batched_tokens
        else:
            st.decode_tokens += sched.num_batched_tokens
            sp = st.spec
            sp.decode_seq_steps += len(sched.seqs)
            sp.decode_emitted += emitted
            sp.saved_s_est += dt * (emitted / len(sched.seqs) - 1.0)
            self._step_cost.observe(sched.num_batched_tokens, dt)
            if self.calibrate_spec and st.steps % 16 == 0:
                self.scheduler.config.spec_overhead_rows = self._step_cost.overhead_rows()
        st.busy_s += dt
        return self._collect_finished()

    def _branch(self, sched, logits: torch.Tensor) -> list[tuple[int, Sequence]]:
        """Tree rollouts (engine/tree.py): fork the tree samples whose position about to be sampled is a branch
        point. Each child shares its parent's KV (full blocks by reference, the partial last block copied now: the
        forward that just ran wrote it) and samples from its parent's logits row. Returns (row, child) pairs."""
        seqs = sched.sample_seqs
        need = [r for r, s in enumerate(seqs) if s.tree is not None and s.tree[0].wants_entropy(s.tree[1])]
        ents: dict[int, float] = {}
        if need:
            idx = torch.tensor(need, dtype=torch.long, device=logits.device)
            temps = torch.tensor([seqs[r].params.temperature for r in need], device=logits.device)
            ents = dict(zip(need, entropy(logits.index_select(0, idx), temps).tolist()))
        born: list[tuple[int, Sequence]] = []
        copies: list[tuple[int, int]] = []
        for r, seq in enumerate(list(seqs)):
            if seq.tree is None:
                continue
            tree, slot = seq.tree
            pos = seq.num_output_tokens
            if not tree.branches_at(slot, pos, ents.get(r)):
                continue
            bm = self.block_manager
            for k in tree.take_chunk(slot, pos):
                child = tree.slots[k].seq
                _inherit(child, seq)
                if len(seq) % bm.block_size and not bm.num_free_blocks:
                    # No block for the copy of the partial last block: the child waits as its prefix resubmitted
                    # (prefilled from the prefix cache when it is admitted), and samples position `pos` then, from
                    # the same distribution with its own seed.
                    child.status = SeqStatus.WAITING
                    self.scheduler.waiting.appendleft(child)
                    continue
                cp = bm.fork(seq, child)
                if cp is not None:
                    copies.append(cp)
                child.status = SeqStatus.RUNNING
                self.scheduler.running.append(child)
                born.append((r, child))
        if copies:
            self.runner.copy_blocks(copies)
        self.stats.tree_forks += len(born)
        return born

    def _tree_end(self, seq: Sequence) -> None:
        """A tree sample ended: its children not yet born become copies of it (their law is still the policy's: the
        module NOTE in engine/tree.py), and so do theirs."""
        tree, slot = seq.tree
        for k in tree.orphans(slot):
            c = tree.slots[k]
            c.born = True
            c.fork = seq.num_output_tokens
            child = c.seq
            _inherit(child, seq)
            child.stop_text_cut = seq.stop_text_cut
            child.status = SeqStatus.FINISHED
            child.finish_reason = seq.finish_reason
            self.stats.tree_copies += 1
            self._tree_end(child)

    def _update(self, sched, token_ids: list[int], logprobs: list[float]) -> int:
        version = self.weight_version
        for seq, tok, lp in zip(sched.sample_seqs, token_ids, logprobs):
            self._emit(seq, tok, lp, version)
        return len(token_ids)

    def _emit(self, seq: Sequence, tok: int, lp: float, version: int) -> bool:
        """Append one sampled token and apply the stop conditions; False when the sequence finished."""
        sch = self.scheduler
        sch.append_token(seq, tok, lp, version)
        if seq.spec is not None:
            seq.spec.drafter.observe(seq, (tok,))
        reason = sch.check_stop(seq)
        if reason is None and seq.params.stop:
            reason = self._check_stop_strings(seq)
        if reason is not None:
            sch.finish(seq, reason)
            if seq.tree is not None:
                self._tree_end(seq)
            self._touched.add(seq.request_id)
            return False
        return True

    def _update_verified(self, sched, token_ids: list[int], logprobs: list[float]) -> int:
        """A decode step with draft rows: each sequence emits its sampled tokens up to and including the first
        that differs from its draft (engine/speculative.py); stop conditions apply token by token."""
        version = self.weight_version
        sp = self.stats.spec
        sp.verify_steps += 1
        row = 0
        emitted = 0
        for seq, draft in zip(sched.seqs, sched.drafts):
            n_rows = 1 + len(draft)
            toks = token_ids[row : row + n_rows]
            lps = logprobs[row : row + n_rows]
            row += n_rows
            n = accepted_prefix(draft, toks)
            if draft:
                st = seq.spec
                acc = n - 1  # draft tokens accepted (the last emitted token is a replacement or the bonus)
                tested = min(len(draft), n)
                st.accepted += acc
                st.tested += tested
                st.drafter.accepted += acc
                st.drafter.tested += tested
                sp.draft_tokens += len(draft)
                sp.accepted_tokens += acc
                sp.tested_tokens += tested
            for tok, lp in zip(toks[:n], lps[:n]):
                emitted += 1
                if not self._emit(seq, tok, lp, version):
                    break  # a stop inside the accepted run: the rest is dropped
            else:
                if draft:
                    self.block_manager.trim(seq)
        return emitted

    def _check_stop_strings(self, seq: Sequence) -> FinishReason | None:
        if self.tokenizer is None:
            return None
        text = self.tokenizer.decode(seq.output_token_ids, skip_special_tokens=True)
        cuts = [i for i in (text.find(s) for s in seq.params.stop or []) if i >= 0]
        if cuts:
            seq.stop_text_cut = min(cuts)
            return "stop"
        return None

    def _collect_finished(self) -> list[RequestOutput]:
        done = []
        for rid in list(self._touched):
            req = self.requests.get(rid)
            if req is not None and all(s is None or s.is_finished for s in req.seqs):
                done.append(self._make_output(req))
                del self.requests[rid]
        self._touched = set()
        return done

    def _make_output(self, req: _Request, slots: Iterable[int] | None = None) -> RequestOutput:
        outs = []
        for j in range(len(req.seqs)) if slots is None else slots:
            seq = req.seqs[j]
            if seq is None:
                outs.append(req.done_outputs[j])
                continue
            ids = seq.output_token_ids
            text = ""
            if self.tokenizer is not None:
                text = self.tokenizer.decode(ids, skip_special_tokens=True)
                if seq.stop_text_cut is not None:
                    text = text[: seq.stop_text_cut]
            tp, tf = (req.tree.parent_of(j), req.tree.fork_of(j)) if req.tree is not None else (None, None)
            outs.append(CompletionOutput(j, list(ids), list(seq.output_logprobs), seq.finish_reason, text,
                                         list(seq.output_weight_versions), tp, tf))
        return RequestOutput(req.request_id, req.prompt_token_ids, outs)

    def snapshot(self, request_id: str, slots: Iterable[int] | None = None) -> RequestOutput | None:
        """The request's output so far (unfinished samples have finish_reason None); for streaming. `slots`: only
        those samples, in that order (each output's `index` says which)."""
        req = self.requests.get(request_id)
        return None if req is None else self._make_output(req, slots)

    def finished_slots(self, request_id: str) -> list[int]:
        """The samples of an unfinished request that have already ended (a tree's leaves end one by one, and a
        stopping rule scores them before their siblings are done); [] for an unknown request."""
        req = self.requests.get(request_id)
        if req is None:
            return []
        return [j for j, s in enumerate(req.seqs) if s is None or s.is_finished]

    # ------------------------------------------------------------------ control
    def abort(self, request_id: str) -> RequestOutput | None:
        """End a request now; returns its partial output (unfinished samples get finish_reason 'abort')."""
        req = self.requests.get(request_id)
        if req is None:
            return None
        tree = req.tree
        for j, seq in enumerate(req.seqs):
            if seq is None or (tree is not None and not tree.slots[j].born):
                continue  # an unborn tree sample is resolved by its parent (a lower slot) just before
            if not seq.is_finished:
                self.scheduler.finish(seq, "abort")
            if tree is not None:
                self._tree_end(seq)  # its unborn children: aborted copies of it
        del self.requests[request_id]
        self._touched.discard(request_id)
        return self._make_output(req)

    def interrupt(self) -> list[RequestOutput]:
        """Abort every unfinished request and return their partial outputs (resumable via `partial=`)."""
        return [o for o in (self.abort(rid) for rid in list(self.requests)) if o is not None]

    def load_weights(self, weights: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]],
                     version: int | None = None, strict: bool = False) -> int:
        """Copy HF-named weights into the model (a full or partial state dict) and invalidate the prefix cache.
        Running sequences keep their KV and continue under the new weights.

        version: the weight version the caller assigns (in RL: the trainer's update count, so every engine and
        every token agrees on what a version means); None = the current version + 1. Returns the new version."""
        items = weights.items() if isinstance(weights, Mapping) else weights
        self._mapper.load(items, strict=strict, source="load_weights: ")
        self.runner.refresh_weights()
        if version is not None and (not isinstance(version, int) or version < 0):
            raise ValueError(f"load_weights: version must be a non-negative integer, got {version!r}")
        self.weight_version = self.weight_version + 1 if version is None else version
        self.block_manager.reset_prefix_cache()
        return self.weight_version


def _inherit(child: Sequence, parent: Sequence) -> None:
    """A tree child takes its parent's tokens so far, with their log-probs and weight versions."""
    child.token_ids = list(parent.token_ids)
    child.output_logprobs = list(parent.output_logprobs)
    child.output_weight_versions = list(parent.output_weight_versions)


def _eos_ids(hf_config: object, tokenizer: Tokenizer | None) -> set[int]:
    ids: set[int] = set()
    for src in (getattr(hf_config, "eos_token_id", None), getattr(tokenizer, "eos_token_id", None)):
        if isinstance(src, int):
            ids.add(src)
        elif isinstance(src, (list, tuple)):
            ids.update(int(x) for x in src)
    gen = getattr(hf_config, "_name_or_path", None)
    if gen:
        p = Path(gen) / "generation_config.json"
        if p.is_file():
            try:
                e = json.loads(p.read_text()).get("eos_token_id")
            except json.JSONDecodeError:
                e = None
            if isinstance(e, int):
                ids.add(e)
            elif isinstance(e, list):
                ids.update(int(x) for x in e)
    return ids


def load_tokenizer(model_dir: str | Path) -> Tokenizer | None:
    """The checkpoint's tokenizer, or None when the directory has no tokenizer files (token-id prompts only)."""
    d = Path(model_dir)
    if not any((d / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")):
        return None
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(d))
    except Exception as e:  # noqa: BLE001 - report which file is bad, in one line
        raise ValueError(f"cannot load the tokenizer in {d}: {type(e).__name__}: {e}") from None
