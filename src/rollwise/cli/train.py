"""`rollwise train [CONFIG.yaml] [--set k=v ...] [--out RUN_DIR] [--resume [RUN_DIR]]`: RL training.

With no config it runs the embedded default (built-in tiny model, supervised warm-up, GRPO on arithmetic).
`--resume RUN_DIR` continues that run under its own `RUN_DIR/config.yaml`; a config or --set given with it must
agree on every key that changes results (one line names each key that differs). `run.resume: true` in the YAML
(or `--set run.resume=true`) is the same as `--resume` and gets the same check. The run then checks the config
against the one its checkpoint was trained under (run/resume.py), which also catches a hand-edited config.yaml.
The config is parsed and validated before anything heavy is imported, so a bad key fails in a second.
`--print-config` prints it and exits; `--defaults` starts from every key's documented default instead of the
embedded recipe (a config to start from, for any model); `--doc` puts each key's description above it.
"""

from __future__ import annotations

import argparse
from pathlib import Path


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("train", help="RL training (no config: the embedded default)",
                              description=__doc__.splitlines()[0])
    p.add_argument("config", nargs="?", help="YAML run config (default: the embedded default)")
    p.add_argument("--config", dest="config_flag", metavar="CONFIG.yaml",
                   help="the YAML run config, as a flag (as eval and generate take it)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config key, e.g. --set train.lr=5e-5 (repeatable)")
    p.add_argument("--out", help="run directory (overrides run.out_dir)")
    p.add_argument("--resume", nargs="?", const=True, default=None, metavar="RUN_DIR",
                   help="continue from the latest checkpoint of RUN_DIR (or of --out / run.out_dir), under the "
                        "run's own config.yaml")
    p.add_argument("--print-config", action="store_true", help="print the resolved config and exit")
    p.add_argument("--defaults", action="store_true",
                   help="start from the documented default of every key instead of the embedded default recipe "
                        "(with --print-config: a config to start from, loadable for any model.path)")
    p.add_argument("--doc", action="store_true",
                   help="with --print-config: each key's description as a comment above it")


def resolve_config(config: str | None, overrides: list[str], out: str | None, resume: bool | str | None, *,
                   defaults: bool = False):
    """The config to run: as given (`defaults`: from the documented field defaults, not the embedded recipe), or
    for a resume the run's saved config.yaml (with what was given checked against it: keys that change results
    must agree)."""
    from rollwise.cli.main import UserError
    from rollwise.config import load_config, resume_conflicts

    if defaults:
        if config is not None:
            raise UserError(f"--defaults starts from the documented defaults, {config} from its own keys (and the "
                            "defaults for the rest): give one")
        if resume:
            raise UserError("--defaults starts a new config; --resume continues under the run's own config.yaml")
        return load_config(None, list(overrides) + ([f"run.out_dir={out}"] if out else []), defaults=True)
    if isinstance(resume, str):
        if out and Path(out).resolve() != Path(resume).resolve():
            raise UserError(f"--resume {resume} and --out {out} name different run directories")
        out = resume
    where = [f"run.out_dir={out}"] if out else []
    if not resume:
        cfg = load_config(config, list(overrides) + where)
        if not cfg.run.resume:
            return cfg
        resume = True  # run.resume: true in the YAML or a --set: the same check as --resume
    run_dir = Path(out) if out else load_config(config, list(overrides)).run.out_dir
    saved_path = Path(run_dir) / "config.yaml"
    pin = [f"run.out_dir={run_dir}", "run.resume=true"]
    if not saved_path.is_file():
        if isinstance(resume, str):
            raise UserError(f"--resume {resume}: no config.yaml there (not a run directory)")
        return load_config(config, list(overrides) + pin)  # --resume on a run that never started: start it
    saved = load_config(saved_path, pin, saved_run=True)
    if config is None:
        wanted = load_config(saved_path, list(overrides) + pin, saved_run=True)
    else:
        wanted = load_config(config, list(overrides) + pin)
    diffs = resume_conflicts(saved, wanted)
    if diffs:
        raise UserError(f"cannot resume {run_dir}: {'; '.join(diffs)} (saved config.yaml -> given; keys that change "
                        "results must match)")
    return wanted


def run(args: argparse.Namespace) -> int:
    from rollwise.cli.main import UserError
    from rollwise.config import dump_config

    from rollwise.envs.build import check_env_section

    if args.doc and not args.print_config:
        raise UserError("--doc comments the printed config: use it with --print-config")
    if args.config and args.config_flag and args.config != args.config_flag:
        raise UserError(f"two configs given: {args.config} and --config {args.config_flag}")
    config = args.config or args.config_flag
    cfg = resolve_config(config, args.overrides, args.out, args.resume, defaults=args.defaults)
    check_env_section(cfg.env.name, cfg.env.kwargs, cfg.env.module)  # env.kwargs typos fail here, before any work
    if args.print_config:
        if args.doc:
            from rollwise.config_doc import dump_config_doc

            print(dump_config_doc(cfg), end="")
        else:
            print(dump_config(cfg), end="")
        return 0
    from rollwise.run.resume import finished_run

    from rollwise.cli.terminal import say

    done = finished_run(cfg)  # a resume of a finished run: one line, nothing loaded, evaluated or rewritten
    if done is not None:
        say(done.line())
        return 0
    from transformers.utils import logging as hf_logging

    from rollwise.run.loop import train

    hf_logging.disable_progress_bar()  # "Loading weights" bars on every engine/trainer load drown the run's own output

    summary = train(cfg, log=say)  # its log lines name paths: control characters in them are escaped
    b, a = summary["eval_before"], summary["eval_after"]
    say(f"done in {summary['wall_s']:.0f}s: held-out accuracy {b['accuracy']:.3f} -> {a['accuracy']:.3f} "
        f"(sampled), {b['accuracy_greedy']:.3f} -> {a['accuracy_greedy']:.3f} (greedy); {counts_line(summary)}; "
        f"run directory {summary['run_dir']}")
    return 0


def counts_line(summary: dict) -> str:
    """'64 rollouts: 40 kept, 20 filtered, 4 errored' (truncated and aborted too when there are any)."""
    from rollwise.train.metrics import rollout_counts

    c = summary.get("rollouts") or {}
    return f"{c.get('total', 0)} rollouts: {rollout_counts(c)}"
