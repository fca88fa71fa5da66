"""Metric loggers: where each step's flattened metrics record goes (`run.loggers`), one small class each.

`MetricsLogger` (train/metrics.py) builds the loggers named in `run.loggers` once, at setup (`open_loggers`),
and hands every record to each of them; nothing asks at run time which one is on. A logger is anything with
`write(step, record)` and `close()` (`MetricLogger`); the registry `LOGGERS` maps a config name to its class.

- `jsonl`: RUN_DIR/metrics.jsonl, one flushed and fsynced line per step; the run's record, always on.
- `tensorboard`: scalar events under RUN_DIR/tensorboard.
- `wandb`: a W&B run with its files under RUN_DIR/wandb (WANDB_MODE=offline writes them there and nothing
  else); its id is kept in RUN_DIR/wandb-run-id, so a resumed run continues the same W&B run.
  W&B and MLflow take `run.project` (W&B project, MLflow experiment) and `run.run_name` (default: the run
  directory's name); TensorBoard, which names runs by directory, gets both as a text summary.
- `mlflow`: an MLflow run at MLFLOW_TRACKING_URI (default: sqlite RUN_DIR/mlflow.db, which needs the full
  `mlflow` package; `mlflow-skinny` needs a server or a file store); id kept in RUN_DIR/mlflow-run-id.

Only numbers reach tensorboard, W&B and MLflow (strings and booleans stay in metrics.jsonl). A missing package
is a config error at load (`RunOptions.loggers`); here it is the same one line, for direct Python use. An
external logger that fails mid-run (a full disk, a server gone) is dropped with one warning line and the run
goes on: metrics.jsonl still has every step.

Left out on purpose: logging artifacts, models or rollout tables to the trackers (the run directory holds them).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from rollwise.config import LOGGER_PACKAGES

Record = Mapping[str, Any]
"""A flattened, JSON-safe metrics record ("time/generate": 1.5), "step" and "wall_s" included."""


class LoggerError(ValueError):
    """A logger cannot start (its package is missing, its store cannot be opened): one line, before any step."""


class MetricLogger(Protocol):
    """One destination of per-step metrics."""

    name: str

    def write(self, step: int, record: Record) -> None: ...

    def close(self) -> None: ...


@dataclass
class LoggerContext:
    """What a logger may need to start: where the run writes, what it is called, its config, resumed or not."""

    run_dir: Path
    run_name: str
    """`run.run_name`, else the run directory's name."""
    project: str | None = None
    """`run.project`; None = each tracker's environment variable (WANDB_PROJECT, MLFLOW_EXPERIMENT_NAME), else
    'rollwise'."""
    config: Mapping[str, Any] = field(default_factory=dict)
    """The resolved run config (W&B config, MLflow params); empty outside `rollwise train`."""
    resumed: bool = False


def numeric(record: Record) -> dict[str, float]:
    """The numbers of a record, without 'step' (bools and strings are not scalars to plot)."""
    return {k: float(v) for k, v in record.items()
            if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool)}


def _need(name: str) -> None:
    import importlib.util

    module, pip = LOGGER_PACKAGES[name]
    if importlib.util.find_spec(module) is None:
        raise LoggerError(f"logger '{name}' needs the {module} package, which is not installed: pip install {pip}")


class JsonlLogger:
    """RUN_DIR/metrics.jsonl: one line per step, flushed and fsynced as written (a kill leaves whole lines)."""

    name = "jsonl"

    def __init__(self, ctx: LoggerContext) -> None:
        self.path = ctx.run_dir / "metrics.jsonl"
        self._file = open(self.path, "a", encoding="utf-8")

    def write(self, step: int, record: Record) -> None:
        self._file.write(json.dumps(dict(record), allow_nan=False) + "\n")
        self._file.flush()
        os.fsync(self._file.fileno())

    def close(self) -> None:
        if not self._file.closed:
            self._file.close()


class TensorBoardLogger:
    """Scalar events under RUN_DIR/tensorboard (`torch.utils.tensorboard`)."""

    name = "tensorboard"

    def __init__(self, ctx: LoggerContext) -> None:
        _need("tensorboard")
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as e:
            raise LoggerError(f"logger 'tensorboard' cannot start: {e}") from None
        self._writer = SummaryWriter(log_dir=str(ctx.run_dir / "tensorboard"))
        # TensorBoard names a run by its directory: the project and run name go in as a text summary
        self._writer.add_text("run", f"project: {ctx.project or 'rollwise'}, run: {ctx.run_name}", global_step=0)

    def write(self, step: int, record: Record) -> None:
        for k, v in numeric(record).items():
            self._writer.add_scalar(k, v, global_step=int(step))
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


class WandbLogger:
    """A W&B run, files under RUN_DIR/wandb; project `run.project`, else WANDB_PROJECT, else 'rollwise'; run name
    `run.run_name` (default: the run directory's name); mode from WANDB_MODE."""

    name = "wandb"

    def __init__(self, ctx: LoggerContext) -> None:
        _need("wandb")
        import wandb

        id_file = ctx.run_dir / "wandb-run-id"
        run_id = id_file.read_text().strip() if ctx.resumed and id_file.is_file() else None
        project = ctx.project or os.environ.get("WANDB_PROJECT") or "rollwise"
        self._run = wandb.init(dir=str(ctx.run_dir), project=project,
                               name=ctx.run_name, config=dict(ctx.config), id=run_id,
                               resume="allow" if run_id else None)
        id_file.write_text(self._run.id + "\n")

    def write(self, step: int, record: Record) -> None:
        self._run.log(numeric(record), step=int(step))

    def close(self) -> None:
        self._run.finish()


class MlflowLogger:
    """An MLflow run named `run.run_name` (default: the run directory's name) in experiment `run.project` (else
    MLFLOW_EXPERIMENT_NAME, else 'rollwise'), at MLFLOW_TRACKING_URI or RUN_DIR/mlflow.db."""

    name = "mlflow"

    def __init__(self, ctx: LoggerContext) -> None:
        _need("mlflow")
        from mlflow.tracking import MlflowClient

        uri = os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{(ctx.run_dir / 'mlflow.db').resolve()}"
        id_file = ctx.run_dir / "mlflow-run-id"
        try:
            self._client = MlflowClient(tracking_uri=uri)
            run_id = id_file.read_text().strip() if ctx.resumed and id_file.is_file() else None
            if run_id is None:
                name = ctx.project or os.environ.get("MLFLOW_EXPERIMENT_NAME") or "rollwise"
                exp = self._client.get_experiment_by_name(name)
                exp_id = exp.experiment_id if exp is not None else self._client.create_experiment(name)
                run_id = self._client.create_run(exp_id, run_name=ctx.run_name).info.run_id
                self._log_params(run_id, ctx.config)
            else:
                self._client.update_run(run_id, status="RUNNING")
        except Exception as e:  # noqa: BLE001 - any store error: one line naming the store
            msg = " ".join(str(e).split())[:240]
            raise LoggerError(f"logger 'mlflow' cannot open its tracking store {uri}: {type(e).__name__}: {msg} "
                              "(set MLFLOW_TRACKING_URI)") from None
        self._run_id = run_id
        id_file.write_text(run_id + "\n")

    def _log_params(self, run_id: str, config: Mapping[str, Any]) -> None:
        from mlflow.entities import Param

        params = [Param(k, json.dumps(v, default=str)[:500]) for k, v in _dotted(config).items()]
        for i in range(0, len(params), 100):  # MLflow takes at most 100 params per batch
            self._client.log_batch(run_id, params=params[i:i + 100])

    def write(self, step: int, record: Record) -> None:
        import time

        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(k, v, now, int(step)) for k, v in numeric(record).items()]
        for i in range(0, len(metrics), 1000):
            self._client.log_batch(self._run_id, metrics=metrics[i:i + 1000])

    def close(self) -> None:
        self._client.set_terminated(self._run_id)


def _dotted(d: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """{'train': {'lr': 1e-4}} -> {'train.lr': 1e-4} (MLflow params are flat)."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, Mapping):
            out.update(_dotted(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


LOGGERS: dict[str, type] = {"jsonl": JsonlLogger, "tensorboard": TensorBoardLogger, "wandb": WandbLogger,
                            "mlflow": MlflowLogger}
"""run.loggers name -> class; each takes a `LoggerContext`."""


def open_loggers(names: list[str] | tuple[str, ...], ctx: LoggerContext) -> list[MetricLogger]:
    """The loggers named (jsonl first and always, no repeats), started; LoggerError names the first that cannot
    start, after closing the ones already open."""
    unknown = [n for n in names if n not in LOGGERS]
    if unknown:
        raise LoggerError(f"unknown logger {unknown[0]!r}; known: {', '.join(LOGGERS)}")
    out: list[MetricLogger] = []
    try:
        for name in dict.fromkeys(["jsonl", *names]):
            out.append(LOGGERS[name](ctx))
    except BaseException:
        for lg in out:
            lg.close()
        raise
    return out


def write_all(loggers: list[MetricLogger], step: int, record: Record) -> list[MetricLogger]:
    """Write `record` to every logger; returns the ones still working. metrics.jsonl failing stops the run (it
    is the record); any other logger failing is dropped with one line on stderr."""
    alive = []
    for lg in loggers:
        if lg.name == "jsonl":
            lg.write(step, record)
            alive.append(lg)
            continue
        try:
            lg.write(step, record)
        except Exception as e:  # noqa: BLE001 - an external tracker must not end the run
            sys.stderr.write(f"rollwise: logger '{lg.name}' failed at step {step} and is turned off "
                             f"({type(e).__name__}: {' '.join(str(e).split())[:200]}); metrics.jsonl has every step\n")
            try:
                lg.close()
            except Exception:  # noqa: BLE001
                pass
            continue
        alive.append(lg)
    return alive
