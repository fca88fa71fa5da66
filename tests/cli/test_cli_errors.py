"""Every command against broken inputs, as a user runs it (a subprocess): one error line, no traceback.

Each case is an attack that used to end in a traceback (or in silence): a RemoteEngineError, an http.client
error from a server that does not speak HTTP, an OSError from a file where a directory belongs, an unknown
env kwarg that passed --print-config and died in train as a TypeError, an eval where every sample errored
printing accuracy 0.000. The cases run concurrently (they are mostly interpreter start-up and imports).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from rollwise.cli import errors as cli_errors
from rollwise.cli.main import main

SRC = Path(__file__).resolve().parents[2] / "src"


def run_cli(*argv: str, env_extra: dict[str, str] | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": f"{SRC}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           "OMP_NUM_THREADS": "1", "ROLLWISE_DEBUG": "", **(env_extra or {})}
    return subprocess.run([sys.executable, "-m", "rollwise.cli", *argv], capture_output=True, text=True,
                          timeout=timeout, env=env)


class GarbageHTTPServer:
    """Accepts connections and answers a line that is not HTTP (http.client raises BadStatusLine)."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            try:
                conn.recv(65536)
                conn.sendall(b"garbage garbage\r\n\r\n")
            finally:
                conn.close()


def closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    from rollwise.envs import get_env
    from rollwise.models.builtin import build_builtin_model

    d = tmp_path_factory.mktemp("broken")
    ckpt = build_builtin_model(d / "ckpt", get_env("arithmetic").charset, hidden_size=32, num_layers=1, num_heads=2,
                               num_kv_heads=1, intermediate_size=64, max_position_embeddings=64)
    (d / "bad.yaml").write_text("train: [1, 2\n")
    (d / "baddemo.jsonl").write_text("not json\n")
    (d / "deepdemo.jsonl").write_text('{"messages": ' + "[" * 100_000 + "]" * 100_000 + "}\n")
    (d / "calldemo.jsonl").write_text('{"messages": [{"role": "user", "content": "x"}, {"role": "assistant", '
                                      '"tool_calls": [null]}]}\n')
    (d / "badkey.yaml").write_text("train:\n  lr_rate: 1\n")
    (d / "badvalue.yaml").write_text("train:\n  lr: fast\n")
    (d / "digitz.yaml").write_text("env:\n  kwargs: {digitz: 3}\n")
    (d / "corrupt.parquet").write_bytes(b"PAR1" + b"\x00" * 64 + b"PAR1")
    (d / "bad.jsonl").write_text('{"prompt": "1+1=", "answer": "2"}\n{nope\n')
    (d / "d.jsonl").write_text("".join(json.dumps({"prompt": f"{i}+1=", "answer": str(i + 1)}) + "\n" for i in range(8)))
    (d / "long.jsonl").write_text(json.dumps({"prompt": "1+1=", "answer": "2"}) + "\n"
                                  + json.dumps({"prompt": "1+2=" * 40, "answer": "3"}) + "\n")
    (d / "long_test.jsonl").write_text(json.dumps({"prompt": "2+2=", "answer": "4"}) + "\n")
    (d / "nan.jsonl").write_text('{"prompt": "1+1=", "answer": "2"}\n{"prompt": "2+2=", "answer": NaN}\n')
    (d / "raises.py").write_text("def reward(task, completion):\n    raise RuntimeError('reward exploded')\n")
    (d / "notfn.py").write_text("reward = 3\n")
    (d / "synerr.py").write_text("def broken(:\n")
    (d / "userenv.py").write_text(
        "class Env:\n    name = 'u'\n    def load(self, split='train', n=None, seed=0):\n"
        "        return {}['no_such_key']\n    def score(self, task, completion):\n        return 0.0\n")
    (d / "afile").write_text("x")
    (d / "dirmodel").mkdir()
    (d / "badjson_model").mkdir()
    (d / "badjson_model" / "config.json").write_text("{bad")
    badst = d / "badst_model"
    badst.mkdir()
    (badst / "config.json").write_text((Path(ckpt) / "config.json").read_text())
    (badst / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{garbage}")
    (d / "garbage.gguf").write_bytes(b"not a gguf" * 8)
    (d / "nonempty").mkdir()
    (d / "nonempty" / "f").write_text("x")
    run = d / "run"
    (run / "rollouts").mkdir(parents=True)
    (run / "rollouts" / "step-000001.parquet").write_bytes(b"PAR1garbagePAR1")
    (d / "emptyrun").mkdir()

    def cfg(name: str, text: str) -> str:
        (d / name).write_text(text)
        return str(d / name)

    garbage = GarbageHTTPServer()
    remote = "engine:\n  backend: remote\n  remote_urls: ['http://127.0.0.1:{port}']\nmodel:\n  path: " + str(ckpt) + "\n"
    paths = dict(
        d=d, ckpt=str(ckpt),
        remote_closed=cfg("remote_closed.yaml", remote.format(port=closed_port())),
        remote_garbage=cfg("remote_garbage.yaml", remote.format(port=garbage.port)),
        ds_parquet=cfg("ds_parquet.yaml", f"model:\n  path: {ckpt}\nenv:\n  name: dataset\n  kwargs: {{path: {d}/corrupt.parquet}}\n"
                                          f"  reward: {d}/raises.py:reward\n"),
        ds_jsonl=cfg("ds_jsonl.yaml", f"model:\n  path: {ckpt}\nenv:\n  name: dataset\n  kwargs: {{path: {d}/bad.jsonl}}\n"
                                      f"  reward: {d}/raises.py:reward\n"),
        ds_nan=cfg("ds_nan.yaml", f"model:\n  path: {ckpt}\nenv:\n  name: dataset\n  kwargs: {{path: {d}/nan.jsonl, test_size: 1}}\n"
                                  f"  reward: {d}/raises.py:reward\n"),
        ds_typo=cfg("ds_typo.yaml", f"env:\n  name: dataset\n  kwargs: {{path: {d}/d.jsonl, test_sizee: 2}}\n"
                                    f"  reward: {d}/raises.py:reward\n"),
        errored=cfg("errored.yaml", f"model:\n  path: {ckpt}\nenv:\n  name: dataset\n  kwargs: {{path: {d}/d.jsonl, test_size: 3}}\n"
                                    f"  reward: {d}/raises.py:reward\n"),
        long=cfg("long.yaml", f"model:\n  path: {ckpt}\nenv:\n  name: dataset\n  kwargs: {{path: {d}/long.jsonl, test_path: {d}/long_test.jsonl}}\n"
                              f"  reward: {d}/raises.py:reward\n"),
        notfn=cfg("notfn.yaml", f"model:\n  path: {ckpt}\nenv:\n  name: dataset\n  kwargs: {{path: {d}/d.jsonl, test_size: 2}}\n"
                                f"  reward: {d}/notfn.py:reward\n"),
        synerr=cfg("synerr.yaml", f"model:\n  path: {ckpt}\nenv:\n  module: {d}/synerr.py\n"),
        userenv=cfg("userenv.yaml", f"model:\n  path: {ckpt}\nenv:\n  name: {d}/userenv.py:Env\n"),
    )
    yield paths
    garbage.sock.close()


def cases(p: dict) -> list[tuple[str, list[str], str]]:
    """(command, argv, text the one error line must contain)."""
    d, ck = p["d"], p["ckpt"]
    out = str(d / "out")
    ev = ["eval", "--device", "cpu", "--n", "2", "--samples", "1", "--max-tokens", "2"]
    gen = ["generate", "--device", "cpu", "--n", "2", "--samples", "1", "--max-tokens", "2"]
    return [
        # train: config files
        ("train", ["train", str(d / "missing.yaml")], "config file not found"),
        ("train", ["train", str(d / "bad.yaml")], "invalid YAML at line 2"),
        ("train", ["train", str(d / "badkey.yaml")], "did you mean 'train.lr'"),
        ("train", ["train", str(d / "badvalue.yaml")], "train.lr"),
        ("train", ["train", str(d)], "cannot read config file"),
        ("train", ["train", "--set", "train.lr"], "expected KEY=VALUE"),
        ("train", ["train", str(d / "digitz.yaml"), "--print-config"], "did you mean env.kwargs.digits"),
        ("train", ["train", "--set", "env.name=gsm8", "--print-config"], "did you mean 'gsm8k'"),
        ("train", ["train", p["ds_typo"], "--print-config"], "did you mean env.kwargs.test_size"),
        ("train", ["train", "--resume", str(d / "emptyrun")], "not a run directory"),
        ("train", ["train", "--out", str(d / "afile")], "afile"),
        # train past the config: data, remote engines, the model's context (these import torch: few of them)
        ("train", ["train", p["ds_parquet"], "--out", out + "1"], "cannot read as Parquet"),
        ("train", ["train", p["remote_closed"], "--out", out + "4"], "cannot connect"),
        ("train", ["train", p["remote_garbage"], "--out", out + "5"], "BadStatusLine"),
        ("train", ["train", p["long"], "--out", out + "6"], "long.jsonl:2 is"),
        ("train", ["train", p["errored"], "--out", out + "7", "--set", "rollout.max_tokens=2"],
         f"every sample of step 1, the run's first: reward: RuntimeError: reward exploded (at {d}/raises.py:2)"),
        # sft (all fail before a model loads)
        ("sft", ["sft", "--set", "env.name=arithmetic"], "no sft.path"),
        ("sft", ["sft", "--set", f"sft.path={d}/missing.jsonl"], "does not exist"),
        ("sft", ["sft", "--set", f"sft.path={d}/baddemo.jsonl"], "baddemo.jsonl: line 1: not valid JSON"),
        ("sft", ["sft", "--set", f"sft.path={d}/deepdemo.jsonl"], "deepdemo.jsonl: line 1: nested more than 64"),
        ("sft", ["sft", "--set", f"sft.path={d}/calldemo.jsonl"], "calldemo.jsonl: line 1: assistant message 1: tool"),
        # eval: the model
        ("eval", [*ev, "--model", str(d / "missing"), "--env", "arithmetic"], "model directory not found"),
        ("eval", [*ev, "--model", str(d / "badjson_model"), "--env", "arithmetic"], "not valid JSON"),
        ("eval", [*ev, "--model", str(d / "badst_model"), "--env", "arithmetic"], "model.safetensors"),
        # eval: the config, the environment, its data and the user's code (all fail before a model loads)
        ("eval", [*ev, "--model", ck, "--env", "arithmetic", "--env-arg", "digitz=3"], "did you mean env.kwargs.digits"),
        ("eval", [*ev, "--model", ck, "--env", "arithmetic", "--env-arg", "digits"], "--env-arg expects KEY=VALUE"),
        ("eval", [*ev, "--model", ck, "--env", "dataset", "--env-arg", f"path={d}/d.jsonl"], "no reward of its own"),
        ("eval", [*ev, "--model", ck], "name the environment"),
        ("eval", [*ev, "--config", str(d / "bad.yaml")], "invalid YAML"),
        ("eval", [*ev, "--config", p["ds_jsonl"], "--split", "train"], "bad.jsonl: line 2: not valid JSON"),
        ("eval", [*ev, "--config", p["ds_nan"]], "nan.jsonl: row 2: the answer ('answer') is nan"),
        ("eval", [*ev, "--config", p["ds_parquet"], "--split", "train"], "cannot read as Parquet"),
        ("eval", [*ev, "--config", p["notfn"]], "env.reward"),
        ("eval", [*ev, "--config", p["synerr"], "--env", "arithmetic"], "SyntaxError"),
        ("eval", [*ev, "--config", p["userenv"]], "userenv.py:4: KeyError"),
        ("eval", [*ev, "--model", ck, "--env", "arithmetic", "--samples", "x"], "invalid int value"),
        # eval: scoring and prompts
        ("eval", [*ev, "--config", p["errored"]], "every sample's scoring errored"),
        ("eval", [*ev, "--config", p["long"], "--split", "train"], "long.jsonl:2 is"),
        # generate
        ("generate", [*gen, "--model", ck, "--env", "arithmetic", "--out", str(d / "afile")], "afile"),
        ("generate", [*gen, "--model", ck, "--env", "nope", "--out", out + "g"], "unknown environment 'nope'"),
        ("generate", [*gen, "--model", ck, "--env", "arithmetic"], "--out"),
        # score
        ("score", ["score", "--env", "arithmetic", "--input", str(d)], "a directory, not a file"),
        ("score", ["score", "--env", "arithmetic", "--input", str(d / "missing.jsonl")], "no such file"),
        ("score", ["score", "--env", "nope", "--input", str(d / "d.jsonl")], "unknown environment 'nope'"),
        ("score", ["score", "--env", "arithmetic", "--input", str(d / "d.jsonl"), "--output", "/nonexistent/x.jsonl"],
         "directory /nonexistent does not exist"),
        ("score", ["score", "--env", "arithmetic", "--input", str(d / "d.jsonl"), "--output", str(d)], "is a directory"),
        # report
        ("report", ["report", str(d / "missing")], "does not exist"),
        ("report", ["report", str(d / "afile")], "is a file, not a run directory"),
        ("report", ["report", str(d / "run"), "--output", "/nonexistent/x.html"], "does not exist"),
        # rollouts
        ("rollouts", ["rollouts", "export", str(d / "missing")], "does not exist"),
        ("rollouts", ["rollouts", "counts", str(d / "run")], "not a readable Parquet file"),
        ("rollouts", ["rollouts", "export", str(d / "run")], "not a readable Parquet file"),
        ("rollouts", ["rollouts", "export", str(d / "emptyrun")], "holds no rollout shards"),
        ("rollouts", ["rollouts", "export", str(d / "run"), "--format", "parquet"], "needs --output"),
        ("rollouts", ["rollouts", "export", str(d / "run"), "--skip-bad", "-o", "/nonexistent/x.jsonl"], "does not exist"),
        ("rollouts counts", ["rollouts", "counts"], "required"),
        # serve (argument checks and models; nothing binds)
        ("serve", ["serve", "--model", ck, "--port", "99999"], "--port must be in"),
        ("serve", ["serve", "--model", ck, "--port", "http"], "invalid int value"),
        ("serve", ["serve"], "--model"),
        ("serve", ["serve", "--model", str(d / "missing")], "not a directory (no such path)"),
        ("serve", ["serve", "--model", str(d / "badjson_model")], "not valid JSON"),
        ("serve", ["serve", "--model", ck, "--dtype", "float8"], "unknown dtype"),
        ("serve", ["serve", "--model", ck, "--header-timeout", "nan"], "--header-timeout must be a positive number"),
        # convert
        ("convert", ["convert", str(d / "garbage.gguf"), out + "c"], "GGUF"),
        ("convert", ["convert", str(d / "missing.gguf"), out + "c"], "GGUF file not found"),
        ("convert", ["convert", str(d / "garbage.gguf"), str(d / "nonempty")], "not empty"),
        ("config", ["config", "explain", "algo.beta"], "did you mean 'algo.kl_coef'"),
        ("config", ["config", "explain", "train.lr.x"], "'train.lr' is not a section"),
        # the top level
        ("", ["no-such-command"], "invalid choice"),
    ]


@pytest.fixture(scope="module")
def results(inputs):
    todo = cases(inputs)
    with ThreadPoolExecutor(max_workers=4) as pool:
        done = list(pool.map(lambda c: run_cli(*c[1]), todo))
    return list(zip(todo, done))


def test_every_command_fails_on_broken_input_with_one_line(results):
    bad = []
    for (cmd, argv, want), proc in results:
        lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
        prog = f"rollwise {cmd}" if cmd else "rollwise"
        ok = (proc.returncode == 2 and "Traceback" not in proc.stderr and len(lines) == 1
              and lines[0].startswith(f"{prog}: error: ") and want in lines[0])
        if not ok:
            bad.append(f"{' '.join(argv)[:120]}\n  rc={proc.returncode} want {want!r}\n  stderr: {proc.stderr[-800:]!r}")
    assert not bad, f"{len(bad)} of {len(results)} cases:\n" + "\n".join(bad)


def test_the_cases_cover_every_command(inputs):
    from rollwise.cli.main import COMMANDS

    covered = {c for c, _, _ in cases(inputs)}
    assert set(COMMANDS) <= covered


def test_debug_prints_the_traceback_after_the_line(inputs):
    proc = run_cli("train", str(inputs["d"] / "bad.yaml"), env_extra={"ROLLWISE_DEBUG": "1"})
    lines = proc.stderr.splitlines()
    assert proc.returncode == 2 and lines[0].startswith("rollwise train: error: ") and "Traceback" in proc.stderr
    flag = run_cli("--debug", "train", str(inputs["d"] / "bad.yaml"))
    assert flag.returncode == 2 and "Traceback" in flag.stderr


def test_internal_bug_gets_a_summary_line_then_the_traceback(monkeypatch, capsys):
    import rollwise.cli.report as report_cmd

    # A KeyError raised by code that lives in rollwise's own files (compiled under report.py's name): a bug, not
    # the user's input and not the user's code.
    ns: dict = {}
    exec(compile("def buggy(args):\n    return {}['oops']\n", report_cmd.__file__, "exec"), ns)
    monkeypatch.setattr(report_cmd, "run", ns["buggy"])
    assert main(["report", "anything"]) == cli_errors.EXIT_BUG
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("rollwise report: internal error: KeyError: missing key 'oops' (a bug in rollwise")
    assert err[1].startswith("Traceback") and "buggy" in "\n".join(err)


def test_broken_pipe_on_stdout_is_quiet(tmp_path):
    from rollwise.store.writer import RolloutStore
    from rollwise.types import Rollout

    store = RolloutStore(tmp_path)
    store.write_step(1, [Rollout(prompt_id=f"p{i}", group_id=f"g{i}", sample_index=0, prompt_token_ids=[1, 2],
                                 completion_token_ids=list(range(50)), logprobs=[-0.5] * 50, weight_versions=[0] * 50,
                                 loss_mask=[1] * 50, text="x" * 200, finish_reason="stop", reward=1.0, status="kept",
                                 step=1) for i in range(3000)])
    env = {**os.environ, "PYTHONPATH": f"{SRC}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "rollwise.cli", "rollouts", "export", str(tmp_path)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    first = proc.stdout.readline()  # like `| head -1`
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 0
    assert json.loads(first)["prompt_id"] == "p0" and err == ""


def test_warnings_print_as_one_line(monkeypatch, capsys):
    import warnings

    import rollwise.cli.report as report_cmd

    def warns(args):
        warnings.warn("first line\nsecond line", UserWarning, stacklevel=2)
        return 0

    monkeypatch.setattr(report_cmd, "run", warns)
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        before = warnings.showwarning
        assert main(["report", "anything"]) == 0
        assert warnings.showwarning is before  # main() puts back the hook it installed
    assert capsys.readouterr().err == "rollwise report: warning: first line; second line\n"


ESCAPE = "\x1b]0;owned\x07\x1b[2J\x9b31m\u202e"
"""A terminal title change, a screen clear, a C1 CSI and a right-to-left override, all in one file name."""


def _raw_controls(text: str) -> list[str]:
    return [c for c in text if (ord(c) < 0x20 and c not in "\n\t") or 0x7F <= ord(c) <= 0x9F or c == "\u202e"]


def test_control_characters_from_a_path_reach_the_terminal_escaped(tmp_path, capsys):
    """A path holding terminal escape sequences was printed raw (in an error line, in "wrote PATH"): the
    terminal acted on them. Now every line the CLI prints with outside text shows them as escapes instead."""
    assert main(["report", str(tmp_path / f"run{ESCAPE}")]) == 2
    err = capsys.readouterr().err
    assert not _raw_controls(err) and "run\\x1b]0;owned\\x07\\x1b[2J\\x9b31m\\u202e does not exist" in err
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"step": 1, "reward_mean": 0.5}\n')
    out = tmp_path / f"page{ESCAPE}.html"
    assert main(["report", str(run), "--output", str(out)]) == 0
    printed = capsys.readouterr()
    assert out.is_file() and "wrote " in printed.out and "page\\x1b]0;owned" in printed.out
    assert not _raw_controls(printed.out + printed.err)


def test_every_kind_of_error_line_and_warning_escapes_control_characters(capsys):
    import io

    for exc, code in ((ValueError(f"bad file{ESCAPE}"), cli_errors.EXIT_INPUT),
                      (RuntimeError(f"bug{ESCAPE}"), cli_errors.EXIT_BUG)):
        buf = io.StringIO()
        assert cli_errors.report("report", exc, debug=True, stream=buf) == code
        assert "\\x1b]0;owned" in buf.getvalue() and not _raw_controls(buf.getvalue())
    cli_errors.one_line_warnings("report")(f"file{ESCAPE}", UserWarning, "f.py", 1)
    err = capsys.readouterr().err
    assert "file\\x1b]0;owned" in err and not _raw_controls(err)
