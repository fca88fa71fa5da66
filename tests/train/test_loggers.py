"""run.loggers: jsonl always, tensorboard, W&B and MLflow (offline, in a local directory), a missing package refused
at load in one line, the deprecated run.tensorboard alias, a tracker failing mid-run, and a progress bar that reads
keys the loop really writes.

Attacks: `run.tensorboard: true` (the old default) without the package used to do nothing, silently; the bar
read 'reward' and 'logprob_diff_mean', which no step record has, so it never showed reward or the log-prob gap.
"""

from __future__ import annotations

import io
import json
import struct
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from rich.console import Console

from rollwise.config import ConfigError, load_config
from rollwise.train.loggers import LOGGERS, LoggerError
from rollwise.train.metrics import PROGRESS_FIELDS, MetricsLogger, read_metrics


def _quiet() -> Console:
    return Console(file=io.StringIO(), force_terminal=False)


STEPS = [{"reward_mean": 0.25, "accuracy": 0.5, "loss": 1.5, "note": "x", "time": {"train_s": 2.0}},
         {"reward_mean": 0.5, "accuracy": 0.75, "loss": 1.25, "note": "y", "time": {"train_s": 2.5}},
         {"reward_mean": 0.625, "accuracy": 0.875, "loss": 1.0, "note": "z", "time": {"train_s": 3.0}}]


# ------------------------------------------------------------------ config

def test_loggers_default_to_jsonl_and_jsonl_is_always_on():
    assert load_config(None).run.loggers == ["jsonl"]
    assert load_config(None, ["run.loggers=[tensorboard, tensorboard]"]).run.loggers == ["jsonl", "tensorboard"]
    assert load_config(None, ["run.loggers=[]"]).run.loggers == ["jsonl"]


@pytest.mark.parametrize("name, module, pip", [("tensorboard", "tensorboard", "tensorboard"),
                                               ("wandb", "wandb", "wandb"), ("mlflow", "mlflow", "mlflow-skinny")])
def test_a_logger_whose_package_is_missing_is_one_line_at_load(monkeypatch, name, module, pip):
    monkeypatch.setitem(sys.modules, module, None)  # what find_spec reports for a package that is not installed
    with pytest.raises(ConfigError) as e:
        load_config(None, [f"run.loggers=[jsonl, {name}]"])
    msg = str(e.value)
    assert f"'{name}'" in msg and f"pip install {pip}" in msg and "run.loggers" in msg and "\n" not in msg, msg


def test_mlflow_without_a_usable_tracking_store_is_one_line_at_load(monkeypatch):
    pytest.importorskip("mlflow", reason="mlflow is not installed (pip install mlflow-skinny)")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setitem(sys.modules, "sqlalchemy", None)  # mlflow-skinny: no sqlite store
    with pytest.raises(ConfigError) as e:
        load_config(None, ["run.loggers=[mlflow]"])
    assert "set MLFLOW_TRACKING_URI" in str(e.value) and "\n" not in str(e.value)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:5000")
    assert load_config(None, ["run.loggers=[mlflow]"]).run.loggers == ["jsonl", "mlflow"]


def test_cli_refuses_a_missing_logger_before_any_work(monkeypatch, tmp_path, capsys):
    from rollwise.cli.main import main

    monkeypatch.setitem(sys.modules, "wandb", None)
    out = tmp_path / "run"
    rc = main(["train", "--set", f"run.out_dir={out}", "--set", "run.loggers=[wandb]"])
    err = capsys.readouterr().err
    assert rc == 2 and "needs the wandb package" in err and "Traceback" not in err, err
    assert len(err.strip().splitlines()) == 1, err
    assert not out.exists(), "work started before the config was refused"


def test_tensorboard_true_without_the_package_is_refused_not_silent(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "tensorboard", None)
    with pytest.raises(ConfigError, match="needs the tensorboard package"):
        load_config(None, ["run.tensorboard=true"])


def test_run_tensorboard_is_a_deprecated_alias_with_one_line(capsys):
    on = load_config(None, ["run.tensorboard=true"])
    err = capsys.readouterr().err
    assert on.run.loggers == ["jsonl", "tensorboard"] and on.run.tensorboard is None
    assert err.count("\n") == 1 and "'run.tensorboard' is deprecated" in err and "run.loggers" in err, err
    off = load_config(None, ["run.loggers=[jsonl, wandb]", "run.tensorboard=false"])
    assert off.run.loggers == ["jsonl", "wandb"]
    with pytest.raises(ConfigError, match="contradicts run.loggers"):
        load_config(None, ["run.loggers=[tensorboard]", "run.tensorboard=false"])
    # the saved config.yaml carries loggers only: reading it back says nothing
    import yaml

    from rollwise.config import RunConfig, dump_config

    capsys.readouterr()
    again = RunConfig.model_validate(yaml.safe_load(dump_config(on)))
    assert again.run.loggers == ["jsonl", "tensorboard"] and capsys.readouterr().err == ""


def test_an_unknown_logger_gets_did_you_mean():
    with pytest.raises(ConfigError, match=r"unknown logger 'wandbb'.*did you mean 'wandb'"):
        load_config(None, ["run.loggers=[wandbb]"])


# ------------------------------------------------------------------ the loggers, for real

def _log_steps(run_dir: Path, loggers: list[str], resume_from_step: int | None = None, steps=STEPS, first: int = 1):
    with MetricsLogger(run_dir, loggers=loggers, console=_quiet(), resume_from_step=resume_from_step,
                       run_config={"train": {"lr": 1e-4}, "run": {"loggers": loggers}}) as log:
        assert [lg.name for lg in log.loggers] == list(dict.fromkeys(["jsonl", *loggers]))
        for i, rec in enumerate(steps):
            log.log(first + i, rec)


def test_tensorboard_writes_scalar_events(tmp_path):
    pytest.importorskip("tensorboard", reason="tensorboard is not installed (pip install tensorboard)")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    _log_steps(tmp_path, ["tensorboard"])
    acc = EventAccumulator(str(tmp_path / "tensorboard"))
    acc.Reload()
    assert {"reward_mean", "accuracy", "loss", "time/train_s"} <= set(acc.Tags()["scalars"])
    assert [(e.step, e.value) for e in acc.Scalars("reward_mean")] == [(1, 0.25), (2, 0.5), (3, 0.625)]
    assert "note" not in acc.Tags()["scalars"]


def _wandb_history(run_dir: Path, wait_s: float = 30.0) -> list[dict]:
    """The history records of the offline W&B run under run_dir, read once the run's exit record is on disk
    (wandb's service process writes the file after `finish()` returns)."""
    import time

    deadline = time.monotonic() + wait_s
    while True:
        hist, done = _read_wandb_file(run_dir)
        if done or time.monotonic() > deadline:
            return hist
        time.sleep(0.2)


def _read_wandb_file(run_dir: Path) -> tuple[list[dict], bool]:
    """(history records, whether the exit record was seen) of the run's .wandb file: LevelDB-log framing of
    protobuf `Record`s, 7-byte file header, 32 KiB blocks."""
    from wandb.proto import wandb_internal_pb2 as pb

    [path] = list((run_dir / "wandb").glob("offline-run-*/run-*.wandb"))
    data, pos, buf, out, done = path.read_bytes(), 7, b"", [], False
    while pos + 7 <= len(data):
        left = 32768 - pos % 32768
        if left < 7:
            pos += left
            continue
        _, n, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if pos + 7 + n > len(data):  # a record still being written
            break
        buf, pos = buf + data[pos + 7:pos + 7 + n], pos + 7 + n
        if kind in (1, 4):  # a full record, or the last piece of one
            rec = pb.Record()
            rec.ParseFromString(buf)
            buf = b""
            kind_name = rec.WhichOneof("record_type")
            if kind_name == "history":
                out.append({i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in rec.history.item})
            done = done or kind_name == "exit"
    return out, done


@pytest.fixture
def wandb_offline(monkeypatch, tmp_path):
    pytest.importorskip("wandb", reason="wandb is not installed (pip install wandb)")
    for var, value in {"WANDB_MODE": "offline", "WANDB_SILENT": "true", "WANDB_CONFIG_DIR": tmp_path / "wb-config",
                       "WANDB_CACHE_DIR": tmp_path / "wb-cache", "WANDB_DATA_DIR": tmp_path / "wb-data"}.items():
        monkeypatch.setenv(var, str(value))
    monkeypatch.delenv("WANDB_API_KEY", raising=False)


def test_wandb_offline_in_the_run_directory(tmp_path, wandb_offline):
    run = tmp_path / "run"
    _log_steps(run, ["wandb"])
    hist = _wandb_history(run)
    assert [(h["_step"], h["reward_mean"], h["accuracy"], h["time/train_s"]) for h in hist] == [
        (1, 0.25, 0.5, 2.0), (2, 0.5, 0.75, 2.5), (3, 0.625, 0.875, 3.0)]
    assert not any("note" in h for h in hist)
    run_id = (run / "wandb-run-id").read_text().strip()
    assert run_id and [p.name.endswith(run_id) for p in (run / "wandb").glob("offline-run-*")] == [True]
    assert [r["step"] for r in read_metrics(run)] == [1, 2, 3]


def test_mlflow_file_store_under_tmp_and_resume_continues_the_run(tmp_path, monkeypatch):
    pytest.importorskip("mlflow", reason="mlflow is not installed (pip install mlflow-skinny)")
    from mlflow.tracking import MlflowClient

    store = tmp_path / "mlruns"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", store.as_uri())
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # mlflow >= 3.7 keeps the file store behind this
    run = tmp_path / "run"
    _log_steps(run, ["mlflow"], steps=STEPS[:2])
    _log_steps(run, ["mlflow"], resume_from_step=2, steps=STEPS[2:], first=3)  # a resumed run: same MLflow run
    client = MlflowClient(tracking_uri=store.as_uri())
    run_id = (run / "mlflow-run-id").read_text().strip()
    hist = client.get_metric_history(run_id, "reward_mean")
    assert sorted((m.step, m.value) for m in hist) == [(1, 0.25), (2, 0.5), (3, 0.625)]
    assert [(m.step, m.value) for m in client.get_metric_history(run_id, "time/train_s")][-1] == (3, 3.0)
    info = client.get_run(run_id)
    assert info.data.params["train.lr"] == "0.0001" and info.info.status == "FINISHED"
    assert len(client.search_runs([info.info.experiment_id])) == 1


def test_mlflow_store_that_cannot_open_is_one_line(tmp_path, monkeypatch):
    pytest.importorskip("mlflow", reason="mlflow is not installed (pip install mlflow-skinny)")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "nosuchscheme://x")
    with pytest.raises(LoggerError) as e:
        MetricsLogger(tmp_path, loggers=["mlflow"], console=_quiet())
    assert "logger 'mlflow' cannot open its tracking store nosuchscheme://x" in str(e.value)
    assert "\n" not in str(e.value)


def test_a_tracker_failing_mid_run_is_dropped_with_one_line_and_jsonl_keeps_every_step(tmp_path, monkeypatch,
                                                                                        capsys):
    class Flaky:
        name = "wandb"
        written: list[int] = []

        def __init__(self, ctx):
            pass

        def write(self, step, record):
            if step == 2:
                raise ConnectionError("the tracker went away")
            Flaky.written.append(step)

        def close(self):
            pass

    monkeypatch.setitem(LOGGERS, "wandb", Flaky)
    with MetricsLogger(tmp_path, loggers=["wandb"], console=_quiet()) as log:
        for i, rec in enumerate(STEPS, start=1):
            log.log(i, rec)
        assert [lg.name for lg in log.loggers] == ["jsonl"]
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "logger 'wandb' failed at step 2" in err and "the tracker went away" in err
    assert Flaky.written == [1] and [r["step"] for r in read_metrics(tmp_path)] == [1, 2, 3]


# ------------------------------------------------------------------ the progress bar

def _step_record() -> dict:
    """A step record as the loop writes it (`run.loop.step_metrics`, on hand-made rollouts)."""
    from rollwise.run.loop import step_metrics
    from rollwise.types import Rollout

    def ro(i, reward):
        return Rollout(prompt_id="p", group_id="g", sample_index=i, prompt_token_ids=[1, 2],
                       completion_token_ids=[3, 4, 5], logprobs=[-0.5] * 3, weight_versions=[0] * 3,
                       loss_mask=[1] * 3, reward=reward, status="kept")

    books = SimpleNamespace(generated_tokens=120, gen_s=2.0, score_s=0.5, metrics=lambda: {})
    train_m = {"loss": 0.75, "kl": 0.01, "logprob_diff_mean": 0.0312, "logprob_diff_max": 0.2, "train_s": 1.0}
    return step_metrics([ro(0, 1.0), ro(1, 0.0), ro(2, 1.0), ro(3, 1.0)], 1, 0, books, train_m, gen_wait_s=0.1,
                        producer_wait_s=0.0, sync_s=0.1, step_s=4.0, weight_version=1, staleness_bound=0,
                        engine_counters={}, useful=12)


def test_progress_bar_fields_are_keys_the_loop_writes_and_show(tmp_path):
    rec = _step_record()
    missing = [k for k, _ in PROGRESS_FIELDS if k not in rec]
    assert not missing, f"the progress bar reads keys step_metrics does not write: {missing}"
    assert [label for _, label in PROGRESS_FIELDS] == ["reward", "acc", "tok/s", "logprob gap"]
    tty = Console(file=io.StringIO(), force_terminal=True, width=200)
    with MetricsLogger(tmp_path, total_steps=5, console=tty) as log:
        log.log(1, rec)
    out = tty.file.getvalue()
    for shown in ("reward=0.75", "acc=0.75", "tok/s=30", "logprob gap=0.0312", "1/5"):
        assert shown in out, (shown, out)


@pytest.mark.slow
def test_a_real_run_writes_every_progress_key(tmp_path, run_cfg):
    """End to end: the keys the bar reads are in every line of a real run's metrics.jsonl."""
    from rollwise.run.loop import train

    out = tmp_path / "run"
    train(run_cfg(out, "train.steps=1", "run.loggers=[jsonl]"), log=lambda s: None)
    lines = read_metrics(out)
    assert lines and all(k in line for line in lines for k, _ in PROGRESS_FIELDS), lines


# ------------------------------------------------------------------ run.project and run.run_name

def _wandb_run_record(run_dir: Path, wait_s: float = 30.0):
    """The `run` record (project, display name) of the offline W&B run under run_dir."""
    import time

    from wandb.proto import wandb_internal_pb2 as pb

    deadline = time.monotonic() + wait_s
    while True:
        _, done = _read_wandb_file(run_dir)
        if done or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    [path] = list((run_dir / "wandb").glob("offline-run-*/run-*.wandb"))
    data, pos = path.read_bytes(), 7
    while pos + 7 <= len(data):  # the run record is small and comes first: no block crossing to handle
        _, n, _ = struct.unpack("<IHB", data[pos:pos + 7])
        rec = pb.Record()
        rec.ParseFromString(data[pos + 7:pos + 7 + n])
        if rec.WhichOneof("record_type") == "run":
            return rec.run
        pos += 7 + n
    raise AssertionError("no run record")


def test_project_and_run_name_are_config_keys():
    cfg = load_config(None, ["run.project=addition", "run.run_name=lr-3e-4"])
    assert (cfg.run.project, cfg.run.run_name) == ("addition", "lr-3e-4")
    assert load_config(None).run.project is None and load_config(None).run.run_name is None


def test_wandb_takes_project_and_run_name_from_the_config(tmp_path, wandb_offline, monkeypatch):
    monkeypatch.setenv("WANDB_PROJECT", "from-env")
    run = tmp_path / "run"
    with MetricsLogger(run, loggers=["wandb"], console=_quiet(), project="addition", run_name="lr-3e-4") as log:
        log.log(1, STEPS[0])
    rec = _wandb_run_record(run)
    assert (rec.project, rec.display_name) == ("addition", "lr-3e-4")


def test_mlflow_takes_experiment_and_run_name_and_falls_back_to_the_environment(tmp_path, monkeypatch):
    pytest.importorskip("mlflow", reason="mlflow is not installed (pip install mlflow-skinny)")
    from mlflow.tracking import MlflowClient

    store = tmp_path / "mlruns"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", store.as_uri())
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "from-env")
    client = MlflowClient(tracking_uri=store.as_uri())
    with MetricsLogger(tmp_path / "a", loggers=["mlflow"], console=_quiet(), project="addition", run_name="first"):
        pass
    with MetricsLogger(tmp_path / "b", loggers=["mlflow"], console=_quiet()):  # keys unset: env, then run dir
        pass
    for run_dir, experiment, name in ((tmp_path / "a", "addition", "first"), (tmp_path / "b", "from-env", "b")):
        info = client.get_run((run_dir / "mlflow-run-id").read_text().strip())
        assert client.get_experiment(info.info.experiment_id).name == experiment
        assert info.info.run_name == name


def test_tensorboard_gets_project_and_run_name_as_text(tmp_path):
    pytest.importorskip("tensorboard", reason="tensorboard is not installed (pip install tensorboard)")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    with MetricsLogger(tmp_path, loggers=["tensorboard"], console=_quiet(), project="addition", run_name="x") as log:
        log.log(1, STEPS[0])
    acc = EventAccumulator(str(tmp_path / "tensorboard"))
    acc.Reload()
    [event] = acc.Tensors("run/text_summary")
    assert event.tensor_proto.string_val[0].decode() == "project: addition, run: x"
