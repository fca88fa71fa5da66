"""Attacks on "nothing lost by default": each test is a way a crash, an edit or a link used to lose or corrupt a
run, and checks that it no longer does (run/resume.py, run/rundir.py, train/checkpoint.py, train/metrics.py)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from rollwise.cli.main import main
from rollwise.config import load_config
from rollwise.envs import register_env
from rollwise.envs.arithmetic import ArithmeticEnv
from rollwise.run.loop import train
from rollwise.run.resume import ResumeError
from rollwise.run.rundir import RunDirError
from rollwise.store.writer import RolloutStore
from rollwise.train.checkpoint import CheckpointError
from rollwise.types import Score

QUIET = {"log": lambda s: None}


def weights(run_dir, step):
    return load_file(run_dir / "checkpoints" / f"step-{step}" / "model.safetensors")


def assert_same_weights(a, b):
    assert a.keys() == b.keys()
    assert max((a[k] - b[k]).abs().max().item() for k in a) == 0.0


def metric_steps(run_dir):
    return [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def shard_hashes(run_dir):
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted((run_dir / "rollouts").glob("*.parquet"))}


def dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


# ------------------------------------------------------------------------------------------------- nothing lost


def test_default_config_crash_keeps_every_stored_step_and_reaches_the_same_weights(tmp_path, run_cfg):
    """The old default (checkpoint_every 0) resumed from scratch and deleted the stored shards. Now: no
    checkpoint setting is given (the defaults), the run stops after 4 of 6 steps with no checkpoint on disk, the
    metrics line of step 4 was cut off by the crash and a checkpoint save was half done; the resume re-trains
    1..4 from the stored rollouts, keeps those shards byte for byte, and ends on the uninterrupted run's weights."""
    full, part = tmp_path / "full", tmp_path / "part"
    args = ("train.steps=6", "train.lr=1e-3")
    train(run_cfg(full, *args), **QUIET)
    assert train(run_cfg(part, *args), stop_after=4, **QUIET) is None
    assert not list((part / "checkpoints").glob("step-*"))  # default checkpoint_every (10) > 4: none yet
    lines = (part / "metrics.jsonl").read_text().splitlines(keepends=True)
    (part / "metrics.jsonl").write_text("".join(lines[:3]) + lines[3][:17])  # step 4's line torn by the crash
    tmp = part / "checkpoints" / f".tmp-step-4-{dead_pid()}"
    tmp.mkdir(parents=True)
    (tmp / "model.safetensors").write_bytes(b"half")
    before = shard_hashes(part)
    assert len(before) == 4

    notes: list[str] = []
    train(run_cfg(part, *args, "run.resume=true"), log=notes.append)
    assert any("re-trained steps 1..4" in n for n in notes), notes
    assert {k: v for k, v in shard_hashes(part).items() if k in before} == before  # nothing rewritten or lost
    assert len(shard_hashes(part)) == 6
    assert not tmp.exists()
    assert_same_weights(weights(full, 6), weights(part, 6))
    assert metric_steps(part) == [1, 2, 3, 4, 5, 6]  # step 4's line restored from its shard's record
    a = [json.loads(line) for line in (full / "metrics.jsonl").read_text().splitlines()]
    b = [json.loads(line) for line in (part / "metrics.jsonl").read_text().splitlines()]
    for x, y in zip(a, b):
        assert x["loss"] == y["loss"] and x["reward_mean"] == y["reward_mean"], x["step"]
    assert not (part / "quarantine").exists() or not list((part / "quarantine").glob("rollouts-*"))


def test_checkpoint_between_and_steps_after_it_are_retrained_not_regenerated(tmp_path, run_cfg):
    """Checkpoint at 2, shards up to 5: the resume restores 2 and re-trains 3..5 from the store (the engine never
    generates them again), and the weights after 6 are the uninterrupted run's."""
    full, part = tmp_path / "full", tmp_path / "part"
    args = ("train.steps=6", "train.lr=1e-3", "run.checkpoint_every=2")
    train(run_cfg(full, *args), **QUIET)
    train(run_cfg(part, *args), stop_after=5, **QUIET)
    shutil.rmtree(part / "checkpoints" / "step-4")  # as if killed before step 4's checkpoint was renamed in
    notes: list[str] = []
    train(run_cfg(part, *args, "run.resume=true"), log=notes.append)
    assert any("re-trained steps 3..5" in n for n in notes), notes
    assert_same_weights(weights(full, 6), weights(part, 6))
    assert sorted(p.name for p in (part / "checkpoints").glob("step-*")) == ["step-2", "step-6"]  # keep=2


class _ParityArithmetic(ArithmeticEnv):
    """Arithmetic prompts, reward 1 for an even-length completion: mixed groups, so replay has work."""

    def score(self, task, completion):
        ok = float(len(completion) % 2 == 0)
        return Score(ok, parts={"correct": ok})


@pytest.mark.parametrize("extra", [
    ("replay.enabled=true", "replay.reuse_per_step=6"),
    ("control.policy=partial", "rollout.max_tokens=12", "engine.max_num_seqs=6"),
], ids=["replay", "partial"])
def test_replay_buffer_and_partial_carry_survive_a_resume(tmp_path, run_cfg, extra):
    """The replay buffer and the partial-rollout carry used to start empty after a resume, so the resumed run
    trained on different data. Both are saved with each step's record and each checkpoint now."""
    register_env("parity_arith_resume", _ParityArithmetic, overwrite=True)
    full, part = tmp_path / "full", tmp_path / "part"
    args = ("train.steps=5", "train.lr=1e-3", "run.checkpoint_every=2", "env.name=parity_arith_resume", *extra)
    train(run_cfg(full, *args), **QUIET)
    train(run_cfg(part, *args), stop_after=3, **QUIET)  # checkpoint at 2 (state from it), step 3 from the log
    journal = RolloutStore(part).read_journal(3)
    ckpt_state = torch.load(part / "checkpoints" / "step-2" / "trainer_state.pt", weights_only=True)
    for state in (journal["state"], ckpt_state["data_position"]["loop"]):  # a resume has something to restore
        if "control.policy=partial" in extra:
            assert state["policy"]["carry"]
        else:
            assert state["replay"]["entries"]
    train(run_cfg(part, *args, "run.resume=true"), **QUIET)
    assert_same_weights(weights(full, 5), weights(part, 5))
    ra = [(r.step, r.group_id, r.completion_token_ids) for r in RolloutStore(full).read()]
    rb = [(r.step, r.group_id, r.completion_token_ids) for r in RolloutStore(part).read()]
    assert ra == rb


@pytest.mark.slow
def test_sigkill_with_the_default_config_loses_at_most_the_step_in_flight(tmp_path, tiny_model):
    """A real SIGKILL, twice, with no checkpoint setting given: every shard on disk at the kill survives the
    resume unchanged, and the finished run has every step once and the uninterrupted run's weights."""
    import signal
    import time

    steps = 6
    sets = [f"model.path={tiny_model}", "rollout.prompts_per_step=4", "rollout.samples_per_prompt=4",
            "rollout.max_tokens=6", "env.eval_size=8", f"train.steps={steps}", "run.loggers=[jsonl]",
            "algo.skip_zero_variance=false", "train.lr=1e-3"]

    def cmd(out):
        c = [sys.executable, "-m", "rollwise.cli.main", "train", "--out", str(out)]
        for s in sets:
            c += ["--set", s]
        return c

    env = dict(os.environ, OMP_NUM_THREADS="1")

    def run(out, *more, kill_after=None, delay=0.0):
        proc = subprocess.Popen(cmd(out) + list(more), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
        t0 = time.time()
        while proc.poll() is None:
            if kill_after is not None and len(list((out / "rollouts").glob("step-*.parquet"))) >= kill_after:
                time.sleep(delay)
                proc.send_signal(signal.SIGKILL)
                proc.wait()
                return
            assert time.time() - t0 < 300, "training did not finish"
            time.sleep(0.01)
        assert proc.returncode == 0, proc.stderr.read().decode()[-2000:]

    full, part = tmp_path / "full", tmp_path / "part"
    run(full)
    run(part, kill_after=2, delay=0.0)  # right after a shard's rename: its metrics line may not exist yet
    kept = shard_hashes(part)
    run(part, "--resume", kill_after=4, delay=0.05)
    assert {k: v for k, v in shard_hashes(part).items() if k in kept} == kept
    kept = shard_hashes(part)
    run(part, "--resume")
    assert {k: v for k, v in shard_hashes(part).items() if k in kept} == kept
    assert len(shard_hashes(part)) == steps and metric_steps(part) == list(range(1, steps + 1))
    assert_same_weights(weights(full, steps), weights(part, steps))


# ------------------------------------------------------------------------------------------------- damage


def test_a_damaged_middle_metrics_line_is_kept_aside_not_deleted(tmp_path, run_cfg):
    out = tmp_path / "run"
    train(run_cfg(out, "train.steps=4"), stop_after=3, **QUIET)
    lines = (out / "metrics.jsonl").read_text().splitlines()
    damaged = lines[1][:40] + "\x00garbage"
    (out / "metrics.jsonl").write_text("\n".join([lines[0], damaged, lines[2]]) + "\n")
    train(run_cfg(out, "train.steps=4", "run.resume=true"), **QUIET)
    kept = list((out / "quarantine").glob("metrics-*.jsonl"))
    assert len(kept) == 1 and damaged in kept[0].read_text()
    assert metric_steps(out) == [1, 2, 3, 4]  # step 2's line rebuilt from its shard's record


def test_a_weight_changed_in_place_is_refused_with_one_line(tmp_path, run_cfg, capsys):
    out = tmp_path / "run"
    train(run_cfg(out, "train.steps=3", "run.checkpoint_every=2"), stop_after=2, **QUIET)
    w = out / "checkpoints" / "step-2" / "model.safetensors"
    data = bytearray(w.read_bytes())
    data[-3] ^= 0x01  # one bit of one weight: same size, still a valid safetensors file
    w.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=r"model.safetensors does not match the sha256"):
        train(run_cfg(out, "train.steps=3", "run.resume=true"), **QUIET)
    capsys.readouterr()
    assert main(["train", "--resume", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "sha256" in err and "Traceback" not in err


def _edit_record(path, edit):
    """Rewrite a shard's write-ahead log record as an editing tool would (rows and the rest of the metadata kept)."""
    import pyarrow.parquet as pq

    t = pq.read_table(path)
    meta = dict(t.schema.metadata)
    rec = json.loads(meta[b"rollwise.journal"])
    edit(rec)
    meta[b"rollwise.journal"] = json.dumps(rec).encode()
    pq.write_table(t.replace_schema_metadata(meta), path)


def _negate_advantages(rec):
    rec["trained"] = [[g, i, -a] for g, i, a in rec["trained"]]


@pytest.mark.parametrize("attack, reason", [
    ("copy", "holds step 1's rows and record, not step 2's"),
    ("negate", "write-ahead log record does not match the sha256 sealed with it"),
    ("drop trained", "write-ahead log record does not match the sha256 sealed with it"),
])
def test_a_write_ahead_log_record_that_is_not_its_steps_is_refused(tmp_path, run_cfg, capsys, attack, reason):
    """The write-ahead log was trusted: step 1's shard copied over step 2's re-trained as step 2, a record with
    negated advantages re-trained the other way (both exit 0), a record missing `trained` was a traceback. Each
    record is now sealed to its shard by step and hash; a resume refuses a mismatch with one line and exit 2."""
    register_env("parity_arith_resume", _ParityArithmetic, overwrite=True)  # mixed groups: non-zero advantages
    out = tmp_path / "run"
    args = ("train.steps=3", "env.name=parity_arith_resume")
    train(run_cfg(out, *args), stop_after=2, **QUIET)  # no checkpoint: a resume re-trains 1..2
    p = RolloutStore(out).shard_path(2)
    assert any(a != 0 for _, _, a in RolloutStore(out).read_journal(2)["trained"])  # a negation changes the update
    if attack == "copy":
        shutil.copyfile(RolloutStore(out).shard_path(1), p)
    else:
        _edit_record(p, _negate_advantages if attack == "negate" else lambda rec: rec.pop("trained"))
    before = shard_hashes(out)
    with pytest.raises(ResumeError, match=reason):
        train(run_cfg(out, *args, "run.resume=true"), **QUIET)
    capsys.readouterr()
    assert main(["train", "--resume", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and reason in err and "step-000002.parquet" in err, err
    assert shard_hashes(out) == before and not list((out / "checkpoints").glob("step-*"))  # nothing trained on it


def test_a_sealed_record_of_the_wrong_shape_is_refused_with_one_line(tmp_path, run_cfg):
    """A record sealed as written but missing what a re-train needs (or naming another step) is refused naming the
    shard, never a KeyError traceback."""
    out = tmp_path / "run"
    train(run_cfg(out, "train.steps=3"), stop_after=2, **QUIET)
    store = RolloutStore(out)
    rec = store.read_journal(2)
    rows = store.read(steps=[2])
    for bad, reason in (({k: v for k, v in rec.items() if k != "trained"}, "its 'trained' is missing"),
                        ({**rec, "step": 1}, "it names step 1, not 2"),
                        ({**rec, "trained": [["g", 0]]}, "trained entry 0 is not [group_id, sample_index, advantage]")):
        store.write_step(2, rows, journal=bad)  # sealed: only the record's shape is wrong
        with pytest.raises(ResumeError) as info:
            train(run_cfg(out, "train.steps=3", "run.resume=true"), **QUIET)
        assert "step-000002.parquet: its write-ahead log record is malformed" in str(info.value)
        assert reason in str(info.value) and "\n" not in str(info.value)


def test_a_manifest_whose_step_disagrees_with_its_folder_is_refused(tmp_path, run_cfg):
    out = tmp_path / "run"
    train(run_cfg(out, "train.steps=3", "run.checkpoint_every=2"), stop_after=2, **QUIET)
    os.rename(out / "checkpoints" / "step-2", out / "checkpoints" / "step-7")
    with pytest.raises(CheckpointError, match=r"manifest says step 2, its folder says step 7"):
        train(run_cfg(out, "train.steps=8", "run.resume=true"), **QUIET)


def test_stale_temp_folders_are_removed_at_the_next_start(tmp_path, run_cfg):
    out = tmp_path / "run"
    ck = out / "checkpoints"
    stale = [ck / f".tmp-step-3-{dead_pid()}", ck / f".old-step-2-{dead_pid()}"]
    for p in stale:
        p.mkdir(parents=True)
        (p / "model.safetensors").write_bytes(b"x" * 100)
    (out / "rollouts").mkdir()
    (out / "rollouts" / ".step-000001.parquet.123.tmp").write_bytes(b"half a shard")
    train(run_cfg(out, "train.steps=1"), **QUIET)
    assert not any(p.exists() for p in stale)
    assert not list((out / "rollouts").glob(".*.tmp"))


# ------------------------------------------------------------------------------------------------- config


def test_config_yaml_edited_before_resume_is_named_key_by_key(tmp_path, run_cfg, capsys):
    out = tmp_path / "run"
    train(run_cfg(out, "train.steps=3", "run.checkpoint_every=1"), stop_after=2, **QUIET)
    path = out / "config.yaml"
    original = path.read_text()
    edited = original.replace("lr: 0.0003", "lr: 0.01").replace("temperature: 1.0", "temperature: 0.7")
    assert edited.count("0.01") and edited != original
    path.write_text(edited)
    capsys.readouterr()
    assert main(["train", "--resume", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "config.yaml was edited" in err
    assert "train.lr: 0.0003 -> 0.01" in err and "rollout.temperature: 1.0 -> 0.7" in err
    # A harmless edit (more steps) goes through, and says what changed.
    path.write_text(original.replace("steps: 3", "steps: 4", 1))
    notes: list[str] = []
    cfg = load_config(path, [f"run.out_dir={out}", "run.resume=true"], saved_run=True)
    assert cfg.train.steps == 4
    train(cfg, log=notes.append)
    assert any("config.yaml was edited" in n and "train.steps: 3 -> 4" in n for n in notes), notes
    assert metric_steps(out) == [1, 2, 3, 4]


def test_library_resume_with_a_changed_config_is_refused(tmp_path, run_cfg):
    out = tmp_path / "run"
    train(run_cfg(out, "train.steps=3"), stop_after=2, **QUIET)  # no checkpoint: the records hold the config
    with pytest.raises(ResumeError, match=r"train.lr: 0.0003 -> 0.5"):
        train(run_cfg(out, "train.steps=3", "train.lr=0.5", "run.resume=true"), **QUIET)
    assert len(shard_hashes(out)) == 2  # nothing moved or deleted by the refusal


def test_yaml_run_resume_true_gets_the_same_check_as_the_flag(tmp_path, run_cfg, capsys):
    out = tmp_path / "run"
    train(run_cfg(out, "train.steps=3", "run.checkpoint_every=1"), stop_after=2, **QUIET)
    given = tmp_path / "resume.yaml"
    saved = load_config(out / "config.yaml", saved_run=True)
    given.write_text(f"model: {{path: {saved.model.path}}}\ntrain: {{lr: 0.5, steps: 3}}\nrun: {{resume: true}}\n")
    capsys.readouterr()
    assert main(["train", str(given), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "cannot resume" in err and "train.lr: 0.0003 -> 0.5" in err


# ------------------------------------------------------------------------------------------------- links


@pytest.mark.parametrize("name", ["rollouts", "metrics.jsonl", "config.yaml", "checkpoints/step-1"])
def test_a_link_leading_outside_run_dir_is_refused(tmp_path, run_cfg, name):
    out = tmp_path / "run"
    train(run_cfg(out, "train.steps=2", "run.checkpoint_every=1"), stop_after=1, **QUIET)
    victim = tmp_path / "victim"
    src = out / name
    shutil.move(str(src), str(victim))  # the run's own data, now outside, reached through a link
    os.symlink(victim, src)
    before = {p: p.read_bytes() for p in ([victim] if victim.is_file() else victim.rglob("*")) if p.is_file()}
    with pytest.raises(RunDirError, match=r"symbolic link to .*outside the run directory"):
        train(run_cfg(out, "train.steps=2", "run.resume=true"), **QUIET)
    after = {p: p.read_bytes() for p in ([victim] if victim.is_file() else victim.rglob("*")) if p.is_file()}
    assert after == before


def test_a_hard_linked_metrics_file_is_refused(tmp_path, run_cfg):
    out = tmp_path / "run"
    train(run_cfg(out, "train.steps=2"), stop_after=1, **QUIET)
    os.link(out / "metrics.jsonl", tmp_path / "elsewhere.jsonl")
    with pytest.raises(RunDirError, match="hard links"):
        train(run_cfg(out, "train.steps=2", "run.resume=true"), **QUIET)


def test_a_fresh_run_in_a_used_directory_keeps_the_old_shards_and_checkpoints(tmp_path, run_cfg):
    """A second `rollwise train` (no --resume) into the same RUN_DIR used to delete the first run's shards and
    replace its checkpoints step by step; now both are moved aside, byte for byte."""
    out = tmp_path / "run"
    train(run_cfg(out, "train.steps=3", "run.checkpoint_every=1"), stop_after=3, **QUIET)
    old = shard_hashes(out)
    old_w = (out / "checkpoints" / "step-3" / "model.safetensors").read_bytes()
    train(run_cfg(out, "train.steps=1"), **QUIET)
    (aside,) = list((out / "quarantine").glob("previous-*"))
    assert {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in (aside / "rollouts").iterdir()} == old
    assert (aside / "checkpoints" / "step-3" / "model.safetensors").read_bytes() == old_w
    assert len(shard_hashes(out)) == 1 and sorted(p.name for p in (out / "checkpoints").glob("step-*")) == ["step-1"]


def test_a_live_run_directory_refuses_a_second_run_and_a_killed_holder_frees_it(tmp_path, run_cfg):
    """Two runs into one RUN_DIR: the second used to set the live run's shards and checkpoints aside under it. Now it
    is refused with one line naming the holder, nothing in the folder moves, and the lock dies with its holder."""
    import signal
    import time

    from rollwise.run.rundir import lock_run_dir

    out = tmp_path / "run"
    out.mkdir()
    (out / "rollouts").mkdir()
    (out / "rollouts" / "step-000001.parquet").write_bytes(b"the live run's shard")
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; from rollwise.run.rundir import lock_run_dir; "
                               f"lock_run_dir({str(out)!r}); print('locked', flush=True); time.sleep(60)"],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(RunDirError, match=rf"is in use by another rollwise run \(pid {holder.pid}\)"):
            train(run_cfg(out, "train.steps=1"), **QUIET)
        assert (out / "rollouts" / "step-000001.parquet").read_bytes() == b"the live run's shard"
        assert not (out / "quarantine").exists()
        holder.send_signal(signal.SIGKILL)
        holder.wait()
        deadline = time.time() + 10
        while True:  # the kernel drops an flock when its holder dies, however it dies
            try:
                lock_run_dir(out).release()
                break
            except RunDirError:
                assert time.time() < deadline, "the lock outlived its holder"
                time.sleep(0.05)
    finally:
        holder.kill()
    # Re-taking it in the process that holds it is a no-op; after release another process may take it.
    first = lock_run_dir(out)
    lock_run_dir(out)
    first.release()
    got = subprocess.run([sys.executable, "-c", f"from rollwise.run.rundir import lock_run_dir; lock_run_dir({str(out)!r})"],
                         capture_output=True, text=True)
    assert got.returncode == 0, got.stderr[-500:]


def test_subprocess_cli_resume_reports_replay(tmp_path, run_cfg):
    """The CLI path end to end: `--resume` after a stop prints the re-trained steps and finishes."""
    out = tmp_path / "run"
    train(run_cfg(out, "train.steps=3"), stop_after=2, **QUIET)
    r = subprocess.run([sys.executable, "-m", "rollwise.cli.main", "train", "--resume", str(out)],
                       check=False, capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert r.returncode == 0, r.stderr[-2000:]
    assert "re-trained steps 1..2" in r.stdout and metric_steps(out) == [1, 2, 3]


def test_async_resume_regenerates_only_what_was_never_trained(tmp_path, run_cfg):
    """With async generation the batches made ahead of training are the only thing a resume regenerates; every
    trained step is kept (re-trained from its shard) and stored exactly once."""
    out = tmp_path / "run"
    args = ("train.steps=5", "control.async_staleness=1")
    train(run_cfg(out, *args), stop_after=3, **QUIET)
    kept = shard_hashes(out)
    notes: list[str] = []
    train(run_cfg(out, *args, "run.resume=true"), log=notes.append)
    assert any("re-trained steps 1..3" in n for n in notes), notes
    assert {k: v for k, v in shard_hashes(out).items() if k in kept} == kept and len(shard_hashes(out)) == 5
    assert metric_steps(out) == [1, 2, 3, 4, 5]
    assert {r.step for r in RolloutStore(out).read()} == {1, 2, 3, 4, 5}
