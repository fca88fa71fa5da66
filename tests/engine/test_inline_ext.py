"""The kernel build: announced once with its cost and the switch that skips it, cached under rollwise's cache by a
key that changes with the CPU, the flags, torch and the source."""

from __future__ import annotations

import shutil

import pytest

from rollwise.engine import inline_ext
from rollwise.engine.inline_ext import InlineExtension, build_dir

SOURCE = "int answer() { return 42; }"

needs_compiler = pytest.mark.skipif(shutil.which("c++") is None or shutil.which("ninja") is None,
                                    reason="no C++ compiler or ninja")


@needs_compiler
def test_build_is_announced_once_and_cached(tmp_path, monkeypatch, capfd):
    monkeypatch.setenv("ROLLWISE_CACHE", str(tmp_path))
    ext = InlineExtension("rollwise_test_answer", SOURCE, ["answer"], "test kernels", "the slow path")
    m = ext.get()
    assert m is not None and m.answer() == 42
    assert ext.get() is m
    err = capfd.readouterr().err
    assert err.count("building the test kernels") == 1, err
    assert "ROLLWISE_CPU_KERNELS=0" in err and "built in" in err
    folder = build_dir("rollwise_test_answer", SOURCE)
    assert folder.parent == tmp_path / "kernels" and (folder / "rollwise_test_answer.so").exists()

    again = InlineExtension("rollwise_test_answer", SOURCE, ["answer"], "test kernels", "the slow path")
    assert again.get() is not None
    assert "building" not in capfd.readouterr().err  # a second process (or instance) loads the cached build


def test_key_follows_cpu_flags_and_source(tmp_path, monkeypatch):
    monkeypatch.setenv("ROLLWISE_CACHE", str(tmp_path))
    here = build_dir("k", SOURCE)
    assert build_dir("k", SOURCE) == here
    assert build_dir("k", SOURCE + " ") != here
    assert build_dir("k", SOURCE, ["-O2"]) != here
    monkeypatch.setattr(inline_ext, "_cpu_features", lambda: "model name=another CPU|flags=sse2")
    assert build_dir("k", SOURCE) != here  # a cache shared with another CPU kind is rebuilt, not loaded


def test_switch_off_builds_nothing(tmp_path, monkeypatch, capfd):
    monkeypatch.setenv("ROLLWISE_CACHE", str(tmp_path))
    monkeypatch.setenv("ROLLWISE_CPU_KERNELS", "0")
    assert InlineExtension("rollwise_test_off", SOURCE, ["answer"], "test kernels", "the slow path").get() is None
    assert not (tmp_path / "kernels").exists() and capfd.readouterr().err == ""
