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
