"""SFT on demonstrations (train/sft.py, run/sft.py): the loss is on assistant tokens only, demonstrations are
rendered as rollouts are, bad files fail with one line, and a stage interrupted in the middle resumes exactly."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from rollwise.train.sft import DemoError, load_demos, sft_loss


def test_sft_loss_is_the_mean_nll_of_assistant_tokens_and_has_no_gradient_elsewhere():
    lp = torch.tensor([[-1.0, -2.0, -3.0, -4.0], [-0.5, -0.5, -9.0, 0.0]], requires_grad=True)
    mask = torch.tensor([[1, 1, 0, 1], [0, 1, 0, 0]], dtype=torch.float32)
    loss, m = sft_loss(lp, torch.zeros_like(lp), torch.ones(2), mask, num_tokens=4)
    assert loss.item() == pytest.approx((1 + 2 + 4 + 0.5) / 4) and m["nll"] == pytest.approx(7.5 / 4)
    loss.backward()
    assert torch.equal(lp.grad != 0, mask.bool())  # env / prompt / padding positions get no gradient
    assert lp.grad[0, 0].item() == pytest.approx(-0.25)


def test_demonstrations_render_with_assistant_tokens_masked_in(smollm2_dir):
    from transformers import AutoTokenizer

    from rollwise.models.prompting import PromptFormat
    from rollwise.models.turns import ChatTurns

    tok = AutoTokenizer.from_pretrained(smollm2_dir)
    demo = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello"}, {"role": "user", "content": "Bye?"},
            {"role": "assistant", "content": "Bye"}]
    prompt, ids, mask = ChatTurns(tok, PromptFormat()).render_conversation(demo)
    assert tok.decode([i for i, m in zip(ids, mask) if m]) == "Hello<|im_end|>Bye<|im_end|>"
    assert tok.decode([i for i, m in zip(ids, mask) if not m]) == "\n<|im_start|>user\nBye?<|im_end|>\n<|im_start|>assistant\n"
    assert tok.decode(prompt + ids) + "\n" == tok.apply_chat_template(demo, tokenize=False)


@pytest.mark.parametrize("line, msg", [
    ("not json", "line 1: not valid JSON"),
    ('{"text": "x"}', 'expected {"messages": [...]}'),
    ('{"messages": [{"role": "robot", "content": "x"}]}', "message 0 needs a role"),
    ('{"messages": [{"role": "user", "content": "x"}, {"role": "assistant"}]}', "needs content or tool_calls"),
])
def test_bad_demonstration_files_fail_with_one_line_naming_the_line(tmp_path, line, msg):
    p = tmp_path / "d.jsonl"
    p.write_text(line + "\n")
    with pytest.raises(DemoError, match=msg.replace("[", r"\[").replace("]", r"\]").replace("{", r"\{").replace("}", r"\}")):
        load_demos(p)


@pytest.fixture(scope="module")
def smol_tiny(tmp_path_factory, make_checkpoint, smollm2_dir):
    path = make_checkpoint(tmp_path_factory.mktemp("smol-tiny-sft") / "m", "llama", vocab=49152)
    for f in smollm2_dir.iterdir():
        if f.name.startswith("tokenizer") or f.name.startswith("chat_template"):
            shutil.copy(f, path / f.name)
    return path


def _cfg(tmp_path, model, out, *extra):
    from rollwise.config import load_config

    rows = [{"prompt": f"What is {a} + {a}?", "answer": 2 * a} for a in range(10, 16)]
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    demos = [{"messages": [{"role": "user", "content": r["prompt"]}, {"role": "assistant", "content": str(r["answer"])}]}
             for r in rows]
    (tmp_path / "demos.jsonl").write_text("".join(json.dumps(d) + "\n" for d in demos))
    (tmp_path / "reward.py").write_text("def r(task, completion):\n    return 0.0\n")
    return load_config(None, [f"model.path={model}", "env.name=dataset", f"env.kwargs.path={tmp_path / 'train.jsonl'}",
                              "env.kwargs.test_size=2", f"env.reward={tmp_path / 'reward.py'}:r",
                              f"sft.path={tmp_path / 'demos.jsonl'}", "sft.steps=4", "sft.batch_size=3",
                              "sft.lr=1e-3", "sft.checkpoint_every=2", f"run.out_dir={out}", "model.device=cpu",
                              *extra])


def test_sft_interrupted_in_the_middle_resumes_to_the_same_weights(tmp_path, smol_tiny):
    from safetensors.torch import load_file

    from rollwise.cli.sft import sft_only

    quiet = lambda s: None  # noqa: E731
    whole, _ = sft_only(_cfg(tmp_path, smol_tiny, tmp_path / "a"), quiet)
    path, info = sft_only(_cfg(tmp_path, smol_tiny, tmp_path / "b"), quiet, stop_after=2)
    assert path is None and not (tmp_path / "b" / "sft" / "done.json").exists()
    with open(tmp_path / "b" / "sft" / "metrics.jsonl", "a") as fh:  # step 3 was logged, then the process died
        fh.write(json.dumps({"step": 3, "loss": 1.0}) + "\n" + '{"step": 4, "lo')
    resumed, _ = sft_only(_cfg(tmp_path, smol_tiny, tmp_path / "b", "run.resume=true"), quiet)
    assert resumed.name == whole.name == "step-4"
    a, b = load_file(whole / "model.safetensors"), load_file(resumed / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    steps = [json.loads(x)["step"] for x in (tmp_path / "b" / "sft" / "metrics.jsonl").read_text().splitlines()]
    ref = [json.loads(x) for x in (tmp_path / "a" / "sft" / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4]
    got = [json.loads(x) for x in (tmp_path / "b" / "sft" / "metrics.jsonl").read_text().splitlines()]
    assert [g["loss"] for g in got] == [r["loss"] for r in ref]
    # a finished stage is not run again
    again, info = sft_only(_cfg(tmp_path, smol_tiny, tmp_path / "b", "run.resume=true"), quiet)
    assert again == resumed and info["steps"] == 4


_DEEP = "[" * 100_000 + "]" * 100_000


@pytest.mark.parametrize("line, msg", [
    ('{"messages": ' + _DEEP + "}", "line 1: nested more than 64 levels deep"),  # past the JSON parser's stack
    ('{"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "", "tool_calls": [{"function": '
     '{"name": "f", "arguments": ' + "[" * 500 + "]" * 500 + "}}]}]}", "line 1: nested more than 64 levels deep"),
    ('{"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "tool_calls": "add(1, 2)"}]}',
     "assistant message 1: tool_calls must be a list of calls, not a JSON string"),
    ('{"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "tool_calls": [null]}]}',
     "assistant message 1: tool call 0 must be an object with a function, not null"),
    ('{"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "tool_calls": {"name": "f"}}]}',
     "tool_calls must be a list of calls, not a JSON object"),
    ('{"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "tool_calls": [{"function": "f"}]}]}',
     "tool call 0: its function must be an object with a name, not string"),
    ('{"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "tool_calls": [{"function": {"name": 3}}]}]}',
     "tool call 0 needs a function name"),
    ('{"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "tool_calls": [{"function": {"name": "f", '
     '"arguments": 5}}]}]}', "tool call 0 arguments must be an object or a JSON string, not number"),
    ('{"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": ["hi"]}]}',
     "assistant message 1 content must be a string, not array"),
])
def test_hostile_demonstration_lines_are_one_line_errors_naming_file_and_line(tmp_path, line, msg):
    """Deeply nested JSON and tool_calls of the wrong shape used to surface as RecursionError or AttributeError
    tracebacks (at load, or later while rendering); each is now refused at load, naming the file and the line."""
    p = tmp_path / "d.jsonl"
    p.write_text(line + "\n")
    with pytest.raises(DemoError) as info:
        load_demos(p)
    text = str(info.value)
    assert text.startswith(f"{p}: line 1: ") and msg in text and "\n" not in text


def _hold_lock(run_dir):
    import subprocess
    import sys

    holder = subprocess.Popen([sys.executable, "-c", "import time; from rollwise.run.rundir import lock_run_dir; "
                               f"lock_run_dir({str(run_dir)!r}); print('locked', flush=True); time.sleep(60)"],
                              stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "locked"
    return holder


def test_sft_into_a_live_runs_folder_is_refused_and_moves_nothing(tmp_path, smol_tiny):
    """`rollwise sft` took no lock: run into the folder of a live `rollwise train`, it moved that run's SFT stage
    aside and wrote its own. Now it is refused with one line naming the holder; nothing in the folder moves."""
    from rollwise.cli.sft import sft_only
    from rollwise.run.rundir import RunDirError

    out = tmp_path / "run"
    (out / "sft").mkdir(parents=True)
    (out / "sft" / "metrics.jsonl").write_text('{"step": 1, "loss": 1.0}\n')
    holder = _hold_lock(out)
    try:
        with pytest.raises(RunDirError, match=rf"in use by another rollwise run \(pid {holder.pid}\)"):
            sft_only(_cfg(tmp_path, smol_tiny, out), lambda s: None)
    finally:
        holder.kill()
        holder.wait()
    assert (out / "sft" / "metrics.jsonl").read_text() == '{"step": 1, "loss": 1.0}\n'
    assert not (out / "quarantine").exists()


def test_sft_folder_linked_outside_the_run_is_refused(tmp_path, smol_tiny):
    """RUN_DIR/sft as a symbolic link out of RUN_DIR was followed: the stage's metrics and checkpoints landed
    outside. Now the link is refused before anything is written."""
    from rollwise.cli.sft import sft_only
    from rollwise.run.rundir import RunDirError

    out, victim = tmp_path / "run", tmp_path / "victim"
    out.mkdir()
    victim.mkdir()
    (out / "sft").symlink_to(victim)
    with pytest.raises(RunDirError, match=r"sft is a symbolic link to .*outside the run directory"):
        sft_only(_cfg(tmp_path, smol_tiny, out, "run.resume=true"), lambda s: None)
    assert list(victim.iterdir()) == []


def test_a_finished_sft_model_changed_in_place_is_refused_on_resume(tmp_path, smol_tiny):
    """A resume used the finished stage's model as it found it. Now it is verified by hash: a weight changed in
    place is refused, and so is one whose checkpoint manifest was rewritten to match (done.json keeps the
    manifest's sha256). Each is one line naming the file."""
    from rollwise.cli.sft import sft_only
    from rollwise.run.sft import SftStageError
    from rollwise.train.checkpoint import file_sha256

    out = tmp_path / "run"
    final, _ = sft_only(_cfg(tmp_path, smol_tiny, out), lambda s: None)
    weights = final / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-8:] = bytes(8)  # the last weights zeroed, size unchanged
    weights.write_bytes(bytes(data))
    resume = _cfg(tmp_path, smol_tiny, out, "run.resume=true")
    with pytest.raises(SftStageError) as info:
        sft_only(resume, lambda s: None)
    assert "model.safetensors does not match the sha256" in str(info.value) and "\n" not in str(info.value)
    manifest = final / "checkpoint.json"
    man = json.loads(manifest.read_text())
    man["files"]["model.safetensors"]["sha256"] = file_sha256(weights)
    manifest.write_text(json.dumps(man))
    with pytest.raises(SftStageError, match=r"checkpoint.json does not match the sha256 .*done.json recorded"):
        sft_only(resume, lambda s: None)


def test_a_demonstration_over_the_models_context_is_refused_at_load_naming_its_line(tmp_path, smol_tiny):
    """With engine.max_model_len unset, a demonstration longer than the model's context (its config.json's
    max_position_embeddings, 512 here) trained silently. Now it is refused before any training, naming the file
    and the line."""
    from rollwise.cli.sft import sft_only
    from rollwise.train.sft import DemoError

    cfg = _cfg(tmp_path, smol_tiny, tmp_path / "run")
    demos = tmp_path / "demos.jsonl"
    long = {"messages": [{"role": "user", "content": "count"}, {"role": "assistant", "content": " ".join(["7"] * 700)}]}
    demos.write_text(demos.read_text() + "\n" + json.dumps(long) + "\n")  # a blank line: the line is 8, the demo 7th
    with pytest.raises(DemoError) as info:
        sft_only(cfg, lambda s: None)
    text = str(info.value)
    assert text.startswith(f"{demos}: line 8: ") and "over the model's context" in text and "of 512 tokens" in text
    assert not (tmp_path / "run" / "sft" / "checkpoints").exists()


def test_a_resumed_stage_never_writes_through_a_hard_link_to_its_metrics(tmp_path, smol_tiny):
    """The stage's metrics.jsonl was rewritten and appended to in place on resume: a hard link made elsewhere saw
    every change. Now the resumed stage writes a file of its own."""
    import os

    from rollwise.cli.sft import sft_only

    out = tmp_path / "run"
    sft_only(_cfg(tmp_path, smol_tiny, out), lambda s: None, stop_after=2)
    other = tmp_path / "elsewhere.jsonl"
    os.link(out / "sft" / "metrics.jsonl", other)
    before = other.read_bytes()
    sft_only(_cfg(tmp_path, smol_tiny, out, "run.resume=true"), lambda s: None)
    assert other.read_bytes() == before
    assert [json.loads(x)["step"] for x in (out / "sft" / "metrics.jsonl").read_text().splitlines()] == [1, 2, 3, 4]
