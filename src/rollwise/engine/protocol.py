"""The one engine protocol: what the RL loop, `rollwise eval`/`generate` and the judge ask of an engine.

Implemented by the in-process `LLM`, `RemoteEngine` (an OpenAI-compatible server), `MultiEngine` (several of
those) and `RayEngines` (engine actors). The loop never asks which one it has.

NOTE on weight versions: the version is owned by the trainer. The loop calls `load_weights(state, version)`
with the trainer's update count, every engine adopts that number, and every generated token records the
version that produced it, so "version v" means the same weights everywhere: in staleness metrics, in the
replay buffer's ages, and across engine restarts. `load_weights(state)` without a version (a user loading
weights by hand) counts up by one.

`StepEngine` is the optional finer interface of the in-process engine (`EngineCore`, reached as `LLM.engine`):
submit requests, step, abort mid-generation with partial outputs. Policies that stop samples early or carry
them across updates (control.policy early_stop / partial) need it; remote engines offer it over streaming requests
(`RemoteEngine.stepwise()`, `clients.remote_stream`), Ray engine actors do not (the config refuses those there).

Deliberately left out: streaming (the loop wants whole groups) and engine-side scoring.
"""

from __future__ import annotations

from typing import Any, Protocol, Sequence, cast, runtime_checkable

from rollwise.types import CompletionOutput, RequestOutput, SamplingParams, Tokenizer


@runtime_checkable
class Engine(Protocol):
    """Batch generation with behaviour log-probs, and weight updates under a caller-given version."""

    @property
    def tokenizer(self) -> Tokenizer | None: ...

    @property
    def weight_version(self) -> int: ...

    def generate(self, prompts: Sequence[str] | Sequence[list[int]],
                 sampling_params: SamplingParams | Sequence[SamplingParams] | None = None) -> list[RequestOutput]:
        """One RequestOutput per prompt, in order."""
        ...

    def load_weights(self, state: Any, version: int | None = None) -> int:
        """Adopt HF-named weights as `version` (None: current + 1); returns the version now served."""
        ...

    def abort(self, request_id: str) -> RequestOutput | None:
        """Stop a request that is in flight; its partial outputs, or None when it is not in flight (batch engines
        hold no requests between `generate` calls)."""
        ...

    def counters(self) -> dict[str, int]:
        """The engine's own event counts since it started, for each step's metrics as `engine_<name>` (Ray engine
        actors: `requeued` generate chunks, actor `restarts`); empty for an engine that has none."""
        ...


@runtime_checkable
class StepEngine(Protocol):
    """The step-level interface (`EngineCore`): requests go in, each `step` returns the requests it finished."""

    @property
    def weight_version(self) -> int:
        """The version new tokens are recorded under (read-only here: `load_weights` of the engine moves it)."""
        ...

    def add_request(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
                    partial: list[CompletionOutput] | None = None, drafts: list[list[int]] | None = None) -> None:
        """`drafts`: past continuations to verify speculatively (`engine.speculative`); the output distribution
        is unchanged."""
        ...

    def step(self) -> list[RequestOutput]: ...

    def abort(self, request_id: str) -> RequestOutput | None: ...

    def has_unfinished(self) -> bool: ...


def prompt_list(prompts: Sequence[str] | Sequence[list[int]] | str | list[int]) -> list[str | list[int]]:
    """The prompts of a `generate` call as a list; one prompt alone (a string, or a list of token ids) is taken
    as a batch of one, as every engine has always accepted it."""
    if isinstance(prompts, str):
        return [prompts]
    if prompts and isinstance(prompts[0], int):
        return [cast("list[int]", prompts)]  # its first item is a token id: the whole sequence is one prompt
    return list(cast("Sequence[str | list[int]]", prompts))


def params_list(sampling_params: SamplingParams | Sequence[SamplingParams] | None,
                num_prompts: int) -> list[SamplingParams]:
    """One SamplingParams per prompt: the list given (its length must match), or the one given (default: the
    defaults) for every prompt."""
    params = sampling_params or SamplingParams()
    plist = list(params) if isinstance(params, (list, tuple)) else [cast(SamplingParams, params)] * num_prompts
    if len(plist) != num_prompts:
        raise ValueError(f"{len(plist)} sampling params for {num_prompts} prompts")
    return plist


def step_engine(engine: object) -> StepEngine | None:
    """The step-level engine behind `engine` (an `EngineCore`, or `LLM.engine`), else None."""
    for cand in (engine, getattr(engine, "engine", None)):
        if cand is not None and all(callable(getattr(cand, a, None)) for a in ("add_request", "step", "abort",
                                                                             "has_unfinished")):
            return cast(StepEngine, cand)  # it has the calls; `isinstance` would also demand `weight_version`
    return None
