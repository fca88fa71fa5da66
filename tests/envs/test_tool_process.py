"""The tool process (envs/tool_process.py): what a forked child may hold on to, and how it ends."""

from __future__ import annotations

import os
import select
import time

from rollwise.envs.tool_process import ToolProcess


class Box:
    def __init__(self):
        self.items = []

    def put(self, x: int) -> str:
        self.items.append(x)
        return str(len(self.items))


def test_a_child_holds_no_other_descriptor_so_a_pipe_reader_sees_eof():
    """A pipe the parent is reading (a sandboxed program's stdout) must see EOF when its writer closes, even though a
    tool process was forked while the write end was open."""
    r, w = os.pipe()
    proc = ToolProcess(Box(), str)
    try:
        assert proc.call("put", {"x": 1}, 5.0) == ("ok", "1")  # forked (and serving) while w is open here
        os.close(w)
        assert select.select([r], [], [], 2.0)[0] and os.read(r, 1) == b""  # EOF at once: the child holds no copy
    finally:
        os.close(r)
        proc.kill()


def test_state_comes_back_and_a_killed_child_is_reaped():
    box = Box()
    proc = ToolProcess(box, str)
    assert proc.call("put", {"x": 5}, 5.0) == ("ok", "1")
    reward, attrs, why = proc.finish(False, 5.0)
    assert reward == ("ok", None) and attrs == {"items": [5]} and why is None and box.items == []
    spin = ToolProcess(Box(), str)
    t0 = time.perf_counter()
    assert spin.call("put", {"x": "not an int"}, 5.0)[0] == "ok"  # (any value: the tool does not check)
    assert spin.call("nonexistent", {}, 5.0) == ("failed", "raised AttributeError: 'Box' object has no attribute "
                                                          "'nonexistent'")
    spin.kill()
    assert time.perf_counter() - t0 < 2.0 and not spin.alive


def test_a_fork_that_fails_is_a_reason_not_a_raise(monkeypatch):
    def no_fork():
        raise BlockingIOError(11, "Resource temporarily unavailable")

    monkeypatch.setattr(os, "fork", no_fork)
    proc = ToolProcess(Box(), str)
    kind, why = proc.call("put", {"x": 1}, 5.0)
    assert kind == "failed" and why.startswith("its process could not start (BlockingIOError")
    assert proc.finish(False, 1.0)[2] == why
    proc.kill()


def test_the_config_chooses_where_tools_run(tmp_path):
    from rollwise.config import RunConfig
    from rollwise.run.setup import make_env

    (tmp_path / "env.py").write_text(
        "class Counter:\n"
        "    def reset(self, **row):\n        self.n = 0\n"
        "    def bump(self, k: int) -> int:\n"
        "        \"\"\"Bump.\n\n        Args:\n            k: By how much.\n        \"\"\"\n"
        "        self.n += k\n        return self.n\n"
        "    def get_reward(self) -> float:\n        return float(self.n)\n")
    (tmp_path / "d.jsonl").write_text('{"prompt": "go", "answer": 1}\n' * 4)
    for iso in ("process", "thread"):
        cfg = RunConfig.model_validate({"env": {"name": "dataset", "kwargs": {"path": str(tmp_path / "d.jsonl"),
                                                                             "test_size": 1},
                                                "environment": f"{tmp_path}/env.py:Counter", "tool_isolation": iso}})
        assert make_env(cfg.env).isolation == iso
