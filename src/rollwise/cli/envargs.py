"""What `rollwise eval` and `rollwise generate` share: the environment, the training config, the model and its
prompting, built by the same functions `rollwise train` uses (`run.setup`), so both score and format prompts
exactly as training does.

`--config CONFIG.yaml` (a training config, or a run directory's config.yaml) and `--set KEY=VALUE` give the
`env` section (name, kwargs, reward / rewards, module, pass_threshold, chat_template, system_prompt, turn
limits), the model (path, dtype, device, tokenizer), the engine's sizing and the rollout settings. `--env NAME`
is `--set env.name=NAME`, `--env-arg K=V` is `--set env.kwargs.K=V`, `--max-turns N` is `--set env.max_turns=N`.
A command-line flag wins over the config; a config value (given in --config, or set with --set) wins over the
command's own default; without --config the config is the embedded default's, which sets no `env`.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pydantic is imported only when a command runs, so `rollwise --help` stays fast
    from rollwise.config import RunConfig

TRAIN_EVAL_SEED_OFFSET = 7919
"""run/loop.py samples its held-out evaluations with seed train.seed + 7919; `rollwise eval --config` does too."""


def add_env_args(p: argparse.ArgumentParser, *, split: str, n: int) -> None:
    p.add_argument("--config", metavar="CONFIG.yaml",
                   help="the training config (or a run's config.yaml): env, reward, chat template, system prompt, "
                        "model and rollout settings as training uses them")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config key, e.g. --set env.system_prompt='Be brief.' (repeatable)")
    p.add_argument("--env", default=None, help="environment name (or module:attr); the same as --set env.name=NAME")
    p.add_argument("--env-arg", action="append", default=[], metavar="KEY=VALUE",
                   help="environment constructor argument (YAML value), repeatable; the same as --set env.kwargs.KEY=VALUE")
    p.add_argument("--split", default=split)
    p.add_argument("--n", type=int, default=None, help=f"tasks to load (default {n})")
    p.add_argument("--seed", type=int, default=None, help="task selection and sampling seed (default 0; with --config "
                                                          "train.seed)")
    p.add_argument("--max-turns", type=int, default=None,
                   help="multi-turn environments: most policy turns per episode (env.max_turns, default 4)")
    p.set_defaults(default_n=n)


def positive(args: argparse.Namespace, *names: str) -> None:
    """One-line error for the first of `names` that is given and not a positive integer."""
    from rollwise.cli.errors import UserError

    for name in names:
        v = getattr(args, name)
        if v is not None and v < 1:
            raise UserError(f"--{name.replace('_', '-')} must be a positive integer")


@dataclass
class Setup:
    """The config the command runs under, and whether its values are the user's (--config / --set) or defaults."""

    cfg: RunConfig
    from_config: bool
    """--config was given: the config's rollout / model values are the defaults of the command's flags."""
    set_keys: set[str]
    """Dotted keys given with --set."""

    def pick(self, flag: Any, key: str, default: Any) -> Any:
        """A flag's value: as given, else the config's `key` when the user gave it, else the command's default."""
        if flag is not None:
            return flag
        if self.from_config or key in self.set_keys:
            obj = self.cfg
            for part in key.split("."):
                obj = getattr(obj, part)
            return obj
        return default


def load_setup(args: argparse.Namespace) -> Setup:
    """The run config from --config / --set / --env / --env-arg / --max-turns (module docstring), with the env
    section checked (unknown kwargs: did-you-mean) before anything heavy is imported."""
    from rollwise.cli.errors import UserError
    from rollwise.config import load_config
    from rollwise.envs.build import check_env_section

    overrides = list(args.overrides)
    if args.env is not None:
        overrides.append(f"env.name={args.env}")
    for item in args.env_arg:
        if "=" not in item:
            raise UserError(f"--env-arg expects KEY=VALUE, got {item!r}")
        k, v = item.split("=", 1)
        if not k.strip() or "." in k:
            raise UserError(f"--env-arg expects KEY=VALUE with a plain argument name, got {item!r}")
        overrides.append(f"env.kwargs.{k.strip()}={v}")
    if args.max_turns is not None:
        overrides.append(f"env.max_turns={args.max_turns}")
    if args.config is None and args.env is None and not any(o.startswith("env.name=") for o in args.overrides):
        raise UserError("name the environment: --env NAME, or --config CONFIG.yaml (a training config)")
    # saved_run: keys in the file that have no effect *in training* (a run's resolved config.yaml names every key)
    # are not refused here; --set keys still are.
    cfg = load_config(args.config, overrides, saved_run=True)
    check_env_section(cfg.env.name, cfg.env.kwargs, cfg.env.module)
    set_keys = {o.split("=", 1)[0].strip() for o in args.overrides if "=" in o}
    return Setup(cfg, args.config is not None, set_keys)


def env_and_tasks(setup: Setup, args: argparse.Namespace, *, n_key: str | None, seed: int) -> tuple[Any, list]:
    """The environment the config's `env` section describes (with its reward, as training builds it) and the
    tasks of --split: --n of them, else the config's `n_key` count, else the command's default."""
    from rollwise.cli.errors import UserError
    from rollwise.run.setup import make_env

    env = make_env(setup.cfg.env)
    n = args.n
    if n is None and n_key is not None:
        n = setup.pick(None, n_key, None)
    if n is None:
        n = args.default_n
    tasks = env.load(args.split, n=n, seed=seed)
    if not tasks:
        raise UserError(f"environment {setup.cfg.env.name!r} has no tasks in split {args.split!r}")
    return env, tasks


def model_path(setup: Setup, args: argparse.Namespace) -> str:
    """--model, else the config's model.path (when it is not the built-in model, which lives in a run directory)."""
    from rollwise.cli.errors import UserError

    if args.model:
        return args.model
    path = setup.cfg.model.path if (setup.from_config or "model.path" in setup.set_keys) else None
    if not path or path == "builtin:tiny":
        raise UserError("--model DIR is needed (the config's model.path is the built-in model, built inside the run "
                        "directory: pass --model with a checkpoint directory)")
    return path


def load_llm(setup: Setup, args: argparse.Namespace, seed: int) -> Any:
    """The local engine on --model (or model.path) with the config's tokenizer and engine sizing, as training
    loads it."""
    from pathlib import Path

    from rollwise.engine.core import load_tokenizer
    from rollwise.engine.llm import LLM
    from rollwise.run.setup import engine_kwargs, resolve_device

    cfg = setup.cfg
    tokenizer = None
    if cfg.model.tokenizer:
        tokenizer = load_tokenizer(Path(cfg.model.tokenizer))
        if tokenizer is None:
            raise ValueError(f"model.tokenizer {cfg.model.tokenizer!r} holds no tokenizer files")
    device = resolve_device(setup.pick(args.device, "model.device", "auto"))
    dtype = setup.pick(args.dtype, "model.dtype", "float32")
    sizing = engine_kwargs(cfg.engine, seed) if setup.from_config or any(
        k.startswith("engine.") for k in setup.set_keys) else {"seed": seed}
    return LLM(model_path(setup, args), device=device, dtype=dtype, tokenizer=tokenizer, **sizing)


def prompting(setup: Setup, env: Any, llm: Any, tasks: list) -> tuple[Any, Any, list[int]]:
    """(encode, episode runner or None, stop token ids), built as `run.setup.build_run` builds them:
    `env.chat_template` / `env.system_prompt`, episodes for a multi-turn environment; and every task's prompt
    checked against the model's context (one line naming the first that does not fit)."""
    from rollwise.control.episodes import is_multi_turn
    from rollwise.models.prompting import stop_token_ids, with_template_kwargs
    from rollwise.run.prompt_fit import check_prompts_fit, engine_context
    from rollwise.envs.user_agent import is_agent_env
    from rollwise.run.setup import make_agent_episodes, make_episode_runner, prompt_encoder

    tok = with_template_kwargs(llm.tokenizer, setup.cfg.env.chat_template_kwargs)
    encode = prompt_encoder(setup.cfg.env, tok, env)
    check_prompts_fit(tasks, encode, engine_context(llm))
    runner = make_agent_episodes(setup.cfg.env, setup.cfg.engine.max_model_len, env, tok, encode) \
        if is_agent_env(env) else make_episode_runner(setup.cfg.env, setup.cfg.engine.max_model_len, env, tok, encode) \
        if is_multi_turn(env) else None
    fit = getattr(runner, "fit_context", None)
    if callable(fit) and engine_context(llm):
        fit(engine_context(llm))
    return encode, runner, stop_token_ids(tok, llm.model_dir)
