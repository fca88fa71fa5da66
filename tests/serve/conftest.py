"""Fixtures: a tiny char-level llama checkpoint, an in-process server on a free loopback port."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from serve_util import CHARS, start_server

_spec = importlib.util.spec_from_file_location("_rollwise_root_conftest", Path(__file__).parents[1] / "conftest.py")
_root = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_root)
make_tiny_checkpoint = _root.make_tiny_checkpoint


@pytest.fixture(scope="session")
def char_ckpt(tmp_path_factory) -> Path:
    from rollwise.models.tokenizer import build_char_tokenizer

    tok = build_char_tokenizer(CHARS)
    path = make_tiny_checkpoint(tmp_path_factory.mktemp("serve") / "m", "llama", vocab=len(tok))
    tok.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def other_ckpt(tmp_path_factory, char_ckpt) -> Path:
    """Same architecture and tokenizer, different random weights (for weight-reload tests)."""
    from rollwise.models.tokenizer import build_char_tokenizer

    tok = build_char_tokenizer(CHARS)
    path = make_tiny_checkpoint(tmp_path_factory.mktemp("serve") / "other", "llama", vocab=len(tok), seed=321)
    tok.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def server(char_ckpt):
    srv = start_server(char_ckpt)
    yield srv
    srv.shutdown(drain_s=0.0)


@pytest.fixture(scope="module")
def llm(char_ckpt):
    """The in-process engine the server must agree with (same engine sizing)."""
    from rollwise import LLM

    return LLM(char_ckpt, block_size=4, max_model_len=128)


