"""`rollwise eval` / `rollwise generate --config`: scored and formatted exactly as training does.

Attacks: an eval that scores with the environment's own verifier while training used `env.reward`; a
generate whose prompts lack the training's system prompt; an eval that cannot repeat the run's own held-out
number; errored samples hidden inside "accuracy 0.000".
"""

from __future__ import annotations

import json
import re
import string

from rollwise.cli.main import main
from rollwise.store.writer import RolloutStore

CHARS = string.ascii_letters + string.digits + " <>/?.,:+-*=\n"
TEMPLATE = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}<assistant>"


def _chat_model(path, make_checkpoint):
    """A random tiny model whose character tokenizer has a chat template."""
    from rollwise.models.tokenizer import build_char_tokenizer

    tok = build_char_tokenizer(CHARS)
    tok.chat_template = TEMPLATE
    model = make_checkpoint(path, "llama", vocab=len(tok))
    tok.save_pretrained(model)
    return model, tok


def _write(path, text):
    path.write_text(text)
    return str(path)


def test_eval_with_the_training_config_repeats_the_runs_held_out_eval(tmp_path, run_cfg, capsys):
    from rollwise.run.loop import train

    out = tmp_path / "run"
    summary = train(run_cfg(out, "train.steps=1"), log=lambda s: None)
    before = summary["eval_before"]
    capsys.readouterr()
    # The run's own config.yaml names the initial model (model.path), the env, the eval size and the seeds.
    assert main(["eval", "--config", str(out / "config.yaml"), "--json"]) == 0
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert res["n"] == before["n"] == 8
    for key in ("accuracy", "accuracy_greedy", "reward_mean", "reward_mean_greedy", "errored"):
        assert res[key] == before[key], key
    assert res["samples"] == 8 * 4 and res["samples_greedy"] == 8


def test_eval_and_generate_use_the_configs_reward_and_system_prompt(tmp_path, make_checkpoint, capsys):
    model, tok = _chat_model(tmp_path / "m", make_checkpoint)
    capsys.readouterr()
    reward = _write(tmp_path / "r.py", "def always(task, completion):\n    return 1.0\n")
    cfg = _write(tmp_path / "train.yaml", f"model:\n  path: {model}\n  device: cpu\nenv:\n  name: arithmetic\n"
                                          f"  reward: {reward}:always\n  system_prompt: Add them\nrollout:\n  max_tokens: 3\n")
    # The arithmetic verifier gives a random model ~0; the config's reward (always 1) gives 1.
    assert main(["eval", "--config", cfg, "--n", "4", "--samples", "2", "--json"]) == 0
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert res["accuracy"] == 1.0 and res["accuracy_greedy"] == 1.0 and res["errored"] == 0
    assert main(["eval", "--model", str(model), "--env", "arithmetic", "--n", "4", "--samples", "2",
                 "--max-tokens", "3", "--device", "cpu", "--json"]) == 0
    plain = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert plain["accuracy"] < 1.0

    from rollwise.config import load_config
    from rollwise.envs import get_env
    from rollwise.run.setup import prompt_encoder

    assert main(["generate", "--config", cfg, "--n", "3", "--samples", "2", "--out", str(tmp_path / "g")]) == 0
    rows = RolloutStore(tmp_path / "g").read()
    assert len(rows) == 6 and all(r.reward == 1.0 for r in rows)
    encode = prompt_encoder(load_config(cfg).env, tok)
    by_prompt = {tuple(encode(t)) for t in get_env("arithmetic").load("train", n=3, seed=0)}
    assert {tuple(r.prompt_token_ids) for r in rows} == by_prompt  # the training encoder's ids, exactly
    assert all(tok.decode(r.prompt_token_ids).startswith("<system>Add them\n<user>") for r in rows)
    # --set edits the config like train's --set: no system prompt, no template
    assert main(["generate", "--config", cfg, "--set", "env.system_prompt=null", "--set", "env.chat_template=false",
                 "--n", "3", "--samples", "1", "--out", str(tmp_path / "g2")]) == 0
    assert not any("<system>" in tok.decode(r.prompt_token_ids) for r in RolloutStore(tmp_path / "g2").read())


def test_eval_shows_errored_counts(tmp_path, make_checkpoint, capsys):
    model, _ = _chat_model(tmp_path / "m", make_checkpoint)
    capsys.readouterr()  # the checkpoint writer's progress bar
    reward = _write(tmp_path / "r.py", "def half(task, completion):\n"
                                       "    if int(task.metadata['i']) % 2:\n        raise RuntimeError('odd row')\n"
                                       "    return 1.0\n")
    data = _write(tmp_path / "d.jsonl", "".join(json.dumps({"prompt": f"{i}+1=", "answer": str(i + 1), "i": i}) + "\n"
                                               for i in range(4)))
    cfg = _write(tmp_path / "c.yaml", f"model:\n  path: {model}\n  device: cpu\nenv:\n  name: dataset\n"
                                      f"  kwargs: {{path: {data}, test_path: {data}}}\n  reward: {reward}:half\n"
                                      "rollout:\n  max_tokens: 2\n")
    assert main(["eval", "--config", cfg, "--samples", "3"]) == 0
    cap = capsys.readouterr()
    line = cap.out.strip().splitlines()[-1]
    assert "accuracy 0.500" in line and "errored 6/12 sampled, 2/4 greedy" in line
    warn = cap.err.strip().splitlines()
    # the odd rows (file rows 2 and 4) errored; the first in the (seeded) task order is named with its reason and
    # the line of the reward that raised it
    assert len(warn) == 1 and re.fullmatch(r"rollwise eval: warning: 8 of 16 samples errored and count as wrong; "
                                           r"first: task dataset/test/d\.jsonl:[24]: .*odd row \(at .*/r\.py:\d+\)",
                                           warn[0])
