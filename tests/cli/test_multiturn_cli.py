"""`rollwise generate` and `rollwise eval` run a multi-turn environment as episodes, never single-turn."""

from __future__ import annotations

import json
import string

from rollwise.cli.main import main
from rollwise.store.writer import RolloutStore

CHARS = string.ascii_letters + string.digits + " <>/?.,:+-*=\n"


def test_generate_and_eval_run_tool_calc_as_episodes(tmp_path, make_checkpoint, capsys):
    from rollwise.models.tokenizer import build_char_tokenizer

    tok = build_char_tokenizer(CHARS)
    model = make_checkpoint(tmp_path / "m", "llama", vocab=len(tok))
    tok.save_pretrained(model)
    out = tmp_path / "gen"
    assert main(["generate", "--model", str(model), "--env", "tool_calc", "--n", "3", "--samples", "2",
                 "--max-tokens", "12", "--max-turns", "2", "--out", str(out), "--device", "cpu"]) == 0
    rows = RolloutStore(out).read()
    assert len(rows) == 6 and all(r.env_info.get("turns", 0) >= 1 for r in rows)
    assert all(len(r.loss_mask) == len(r.completion_token_ids) for r in rows)
    capsys.readouterr()
    assert main(["eval", "--model", str(model), "--env", "tool_calc", "--n", "3", "--samples", "2",
                 "--max-tokens", "12", "--max-turns", "2", "--json", "--device", "cpu"]) == 0
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert res["n"] == 3 and res["errored"] == 0 and "reward_mean_greedy" in res
    assert res["accuracy"] == res["reward_mean"] and (res["accuracy"] * 6).is_integer()  # 0/1 reward, 3 x 2 answers
