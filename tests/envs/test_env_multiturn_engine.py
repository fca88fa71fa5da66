"""run_episodes against the real engine (`rollwise.LLM`) on a tiny random model: the behaviour log-probs the
episode carries for policy tokens must equal a teacher-forced forward over the exact token sequence it
built, which holds only if nothing was re-tokenized and env tokens sit where the mask says."""

from __future__ import annotations

import pytest

from rollwise.envs.arithmetic import ArithmeticEnv
from rollwise.envs.base import EpisodeState, Task
from rollwise.envs.multiturn import encode_reply, run_episodes
from rollwise.types import SamplingParams, Score

torch = pytest.importorskip("torch")
llm_mod = pytest.importorskip("rollwise.engine.llm")
tok_mod = pytest.importorskip("rollwise.models.tokenizer")


class EchoEnv:
    """Replies "ok N" after each policy turn; ends after three policy turns."""

    name = "echo"

    def load(self, split="train", n=None, seed=0):
        return ArithmeticEnv().load(split, n, seed)

    def reset(self, task: Task) -> EpisodeState:
        return EpisodeState(task=task)

    def step(self, state: EpisodeState, completion: str):
        state.turn += 1
        return None if state.turn >= 3 else f"\nok {state.turn}\n"

    def score_episode(self, state: EpisodeState) -> Score:
        return Score(float(state.turn))

    def score(self, task, completion):
        return Score(0.0)


@pytest.fixture(scope="module")
def tiny_llm(tmp_path_factory):
    from transformers import AutoModelForCausalLM, LlamaConfig

    path = tmp_path_factory.mktemp("tiny_char_llama")
    tok = tok_mod.build_char_tokenizer(ArithmeticEnv.charset + "ok")
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                      bos_token_id=1, eos_token_id=2, pad_token_id=0)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return llm_mod.LLM(str(path), device="cpu", dtype="float32"), model.eval()


def test_episode_logprobs_match_a_teacher_forced_forward(tiny_llm):
    llm, model = tiny_llm
    tok = llm.tokenizer
    tasks = ArithmeticEnv().load("test", n=3)
    sp = SamplingParams(n=2, temperature=1.0, max_tokens=6, seed=0, ignore_eos=True)
    eps = run_episodes(llm, tok, EchoEnv(), tasks, sp, max_turns=5, max_total_tokens=64)
    assert len(eps) == 6
    for ep in eps:
        assert ep.finish_reason in ("stop", "length")
        assert len(ep.token_ids) == len(ep.loss_mask) == len(ep.logprobs) == len(ep.weight_versions)
        if ep.finish_reason == "stop":
            assert ep.turns == 3 and ep.loss_mask.count(0) == 2 * len(encode_reply(tok, "\nok 1\n"))
        env_ids = [t for t, m in zip(ep.token_ids, ep.loss_mask) if m == 0]
        expected_env = encode_reply(tok, "\nok 1\n") + encode_reply(tok, "\nok 2\n")
        assert env_ids == expected_env[: len(env_ids)]
        seq = torch.tensor([ep.prompt_token_ids + ep.token_ids])
        with torch.no_grad():
            logp = torch.log_softmax(model(seq).logits[0].float(), dim=-1)
        p = len(ep.prompt_token_ids)
        for k, (t, m, lp) in enumerate(zip(ep.token_ids, ep.loss_mask, ep.logprobs)):
            if m:
                assert lp == pytest.approx(logp[p + k - 1, t].item(), abs=2e-4), (ep.task.id, k)
            else:
                assert lp == 0.0
