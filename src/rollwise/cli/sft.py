"""`rollwise sft [CONFIG.yaml] [--set k=v ...] [--out RUN_DIR] [--resume]`: the SFT stage alone.

Runs the config's `sft` section (demonstrations in `sft.path`, rendered as the config's environment renders its
rollouts: chat template, system prompt, tools) into RUN_DIR/sft/ and prints the final model's directory, which
`rollwise eval --config CONFIG --model DIR` evaluates and `model.path` can start RL from. `--resume` continues
from the newest SFT checkpoint; a finished stage is not run again. `rollwise train` with the same config runs this
stage first, then RL.
"""

from __future__ import annotations

import argparse
from pathlib import Path


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("sft", help="supervised fine-tuning on demonstrations (the config's sft section)",
                              description=__doc__.splitlines()[0])
    p.add_argument("config", nargs="?", help="YAML run config with an sft section")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config key, e.g. --set sft.steps=50 (repeatable)")
    p.add_argument("--out", help="run directory (overrides run.out_dir)")
    p.add_argument("--resume", action="store_true", help="continue from the newest SFT checkpoint of the run directory")


def sft_only(cfg, log=None, stop_after: int | None = None):
    """(final model dir or None when stopped early, info) of the config's SFT stage, run on its own."""
    from rollwise.cli.terminal import say
    from rollwise.run.rundir import check_run_dir, lock_run_dir

    log = log if log is not None else say
    run_dir = Path(cfg.run.out_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    lock = lock_run_dir(run_dir)  # a live `rollwise train` or `rollwise sft` in RUN_DIR keeps it
    try:
        check_run_dir(run_dir)  # RUN_DIR/sft (or anything in it) leading outside RUN_DIR is refused
        return _sft_in(cfg, run_dir, log, stop_after)
    finally:
        lock.release()


def _sft_in(cfg, run_dir: Path, log, stop_after: int | None):
    """`sft_only` inside the locked, checked RUN_DIR."""
    from rollwise.engine.core import load_tokenizer
    from rollwise.models.prompting import with_template_kwargs
    from rollwise.run.setup import ModelSource, make_env, prepare_model, prompt_format, resolve_device
    from rollwise.run.sft import SftStage, run_sft, set_aside

    env = make_env(cfg.env)
    base, _ = prepare_model(ModelSource.of(cfg), env, env.load("train", n=cfg.env.train_size, seed=cfg.train.seed), run_dir, log)
    tok = with_template_kwargs(load_tokenizer(Path(cfg.model.tokenizer) if cfg.model.tokenizer else base),
                               cfg.env.chat_template_kwargs)
    if not cfg.run.resume and (aside := set_aside(run_dir)) is not None:
        log(f"{run_dir} held an earlier SFT stage: moved to {aside}")
    return run_sft(SftStage.of(cfg), base, tok, prompt_format(cfg.env, env), run_dir, resolve_device(cfg.model.device), log,
                   stop_after=stop_after)


def run(args: argparse.Namespace) -> int:
    from rollwise.cli.errors import UserError
    from rollwise.config import load_config
    from rollwise.envs.build import check_env_section

    cfg = load_config(args.config, list(args.overrides) + ([f"run.out_dir={args.out}"] if args.out else [])
                      + (["run.resume=true"] if args.resume else []))
    if not cfg.sft.path:
        raise UserError("the config has no sft.path (a JSONL of {\"messages\": [...]} demonstrations)")
    check_env_section(cfg.env.name, cfg.env.kwargs, cfg.env.module)
    from rollwise.train.sft import load_demos

    load_demos(cfg.sft.path)  # a missing or broken demonstration file fails here, before any model loads
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    path, info = sft_only(cfg)
    from rollwise.cli.terminal import say

    say(f"sft done: {info['steps']} steps on {info['demos']} demonstrations, final loss {info['final_loss']}; "
        f"model {path}")
    return 0
