"""On-policy distillation, unit by unit: the per-token reverse-KL advantage against a loop-by-loop reference, its
metrics, the tokenizer check, and the trainer's teacher forward (packed, shared-prompt, multi-turn masks) against
each sequence alone through the teacher's plain HF forward."""

from __future__ import annotations

import math
import random

import pytest
import torch

from rollwise.train.batch import TrainBatch
from rollwise.train.distill import DistillOptions, distill_advantages, distill_metrics, tokenizer_mismatch
from rollwise.train.losses import LOSSES, LossConfig
from rollwise.train.trainer import Trainer, TrainerError

from .conftest import build_tiny_llama, naive_logprobs
from .synthetic import _groups, make_rollouts


def naive_advantages(old, teacher, mask, task, coef, reward_weight):
    """A_t = coef * (log pi_teacher - log pi_policy) + reward_weight * A_task on policy tokens, 0 elsewhere: written
    token by token from the formula (Thinking Machines' on-policy distillation, with the task advantage added)."""
    b, t = len(old), len(old[0])
    out = [[0.0] * t for _ in range(b)]
    for i in range(b):
        for j in range(t):
            if mask[i][j] > 0:
                a_task = task[i] if not isinstance(task[i], list) else task[i][j]
                out[i][j] = coef * (teacher[i][j] - old[i][j]) + reward_weight * a_task
    return out


def _table(rng, b, t, lo=-6.0, hi=-0.01):
    return [[rng.uniform(lo, hi) for _ in range(t)] for _ in range(b)]


@pytest.mark.parametrize("per_token_task", [False, True])
@pytest.mark.parametrize("coef, reward_weight", [(1.0, 0.0), (0.5, 1.0), (2.0, 0.25)])
def test_distill_advantages_equal_the_naive_reference(per_token_task, coef, reward_weight):
    rng = random.Random(7)
    b, t = 5, 9
    old, teacher = _table(rng, b, t), _table(rng, b, t)
    mask = [[float(rng.random() > 0.3) for _ in range(t)] for _ in range(b)]
    mask[2] = [0.0] * t  # a sequence without a policy token
    task = _table(rng, b, t, -1, 1) if per_token_task else [rng.uniform(-1, 1) for _ in range(b)]
    got = distill_advantages(torch.tensor(old), torch.tensor(teacher), torch.tensor(mask), torch.tensor(task),
                             coef=coef, reward_weight=reward_weight)
    want = naive_advantages(old, teacher, mask, task, coef, reward_weight)
    assert got.shape == (b, t) and got.dtype == torch.float32
    torch.testing.assert_close(got, torch.tensor(want), atol=1e-6, rtol=0)
    assert torch.all(got[2] == 0)


def test_distill_advantages_refuse_mismatched_shapes():
    z = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="shapes differ"):
        distill_advantages(z, torch.zeros(2, 4), z, torch.zeros(2), coef=1.0, reward_weight=0.0)
    with pytest.raises(ValueError, match="neither"):
        distill_advantages(z, z, z, torch.zeros(2, 5), coef=1.0, reward_weight=0.0)


def test_distill_metrics_are_policy_token_means():
    rng = random.Random(3)
    old, teacher = _table(rng, 3, 4), _table(rng, 3, 4)
    mask = [[1, 1, 0, 0], [1, 0, 1, 1], [0, 0, 0, 0]]
    n = sum(map(sum, mask))
    kl = sum(old[i][j] - teacher[i][j] for i in range(3) for j in range(4) if mask[i][j]) / n
    tl = sum(teacher[i][j] for i in range(3) for j in range(4) if mask[i][j]) / n
    m = distill_metrics(torch.tensor(old), torch.tensor(teacher), torch.tensor(mask, dtype=torch.float32))
    assert math.isclose(m["distill_reverse_kl"], kl, abs_tol=1e-5)
    assert math.isclose(m["distill_teacher_logprob"], tl, abs_tol=1e-5)
    assert distill_metrics(torch.zeros(1, 2), torch.zeros(1, 2), torch.zeros(1, 2)) == {}


def test_options_from_config():
    from rollwise.config import load_config

    assert DistillOptions.from_config(load_config(None, []).algo.distill) is None
    cfg = load_config(None, ["algo.distill.teacher=some/dir", "algo.distill.coef=0.5",
                             "algo.distill.reward_weight=1", "model.path=x"])
    assert DistillOptions.from_config(cfg.algo.distill) == DistillOptions("some/dir", 0.5, 1.0)


# ------------------------------------------------------------------------------------------------- tokenizers


def test_tokenizer_check_accepts_the_same_and_names_what_differs():
    from rollwise.models.tokenizer import build_char_tokenizer

    a, same = build_char_tokenizer("0123456789+= "), build_char_tokenizer("0123456789+= ")
    assert tokenizer_mismatch(a, same, [([1, 2, 3], [1, 2, 3])]) is None
    other = build_char_tokenizer("0123456789+=- ")
    assert "vocabulary has" in tokenizer_mismatch(a, other)
    shuffled = build_char_tokenizer("1023456789+= ")  # same size, ids swapped
    assert "has id" in tokenizer_mismatch(a, shuffled)
    why = tokenizer_mismatch(a, same, [([5, 6, 7], [5, 6, 7]), ([5, 6, 7, 8], [5, 9, 7, 8])])
    assert why is not None and "training prompt 1" in why and "from token 1" in why


def test_tokenizer_check_names_special_tokens():
    class Tok:
        def __init__(self, eos):
            self.eos_token_id, self.bos_token_id, self.pad_token_id, self.unk_token_id = eos, 1, 0, None
            self.all_special_ids = [0, 1, eos]

        def get_vocab(self):
            return {"a": 0, "b": 1, "c": 2, "d": 3}

    assert tokenizer_mismatch(Tok(2), Tok(2)) is None
    assert tokenizer_mismatch(Tok(2), Tok(3)) == "its eos_token is 3, the policy's 2"


# ------------------------------------------------------------------------------------------------- the trainer


@pytest.fixture(scope="module")
def sharp_teacher(tmp_path_factory, tiny_llama):
    """The tiny Llama with its LM head scaled by 3: the same tokenizer ids, a sharper distribution."""
    from safetensors.torch import load_file, save_file
    import shutil

    out = tmp_path_factory.mktemp("sharp")
    for f in tiny_llama.iterdir():
        shutil.copy(f, out / f.name)
    sd = load_file(out / "model.safetensors")
    sd["lm_head.weight"] = sd["lm_head.weight"] * 3.0
    save_file(sd, out / "model.safetensors", metadata={"format": "pt"})
    return out


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_teacher_logprobs_equal_each_sequence_through_the_teacher(tiny_llama, sharp_teacher, temperature):
    tr = Trainer(tiny_llama, temperature=temperature, distill=DistillOptions(str(sharp_teacher)))
    from transformers import AutoModelForCausalLM

    ref = AutoModelForCausalLM.from_pretrained(sharp_teacher, dtype=torch.float32)
    with torch.no_grad():
        ref.lm_head.weight.div_(temperature)  # logits / T
    for ros in (make_rollouts(8, seed=4), _groups([(5, [3, 6, 1]), (2, [4, 4])])):  # packed; shared prompts
        batch = TrainBatch.from_rollouts(ros, 24)
        got = tr.teacher_logprobs(batch)
        with torch.no_grad():
            want = naive_logprobs(ref, ros, batch.max_completion_len)
        torch.testing.assert_close(got, want, atol=2e-5, rtol=0)
    assert tr.teacher is not None and not any(p.requires_grad for p in tr.teacher.parameters())


def test_distilled_batch_has_per_token_advantages_on_policy_tokens_only(tiny_llama, sharp_teacher):
    opts = DistillOptions(str(sharp_teacher), coef=0.5, reward_weight=2.0)
    tr = Trainer(tiny_llama, distill=opts)
    ros = make_rollouts(6, seed=1)  # odd sequences hold an environment token (loss mask 0)
    assert any(0 in r.loss_mask for r in ros)
    batch = TrainBatch.from_rollouts(ros, 64)
    out, m = tr._distilled(batch)
    teacher = tr.teacher_logprobs(batch)
    want = naive_advantages(batch.old_logprobs.tolist(), teacher.tolist(), batch.loss_mask.tolist(),
                            batch.advantages.tolist(), 0.5, 2.0)
    torch.testing.assert_close(out.advantages, torch.tensor(want), atol=1e-5, rtol=0)
    assert torch.all(out.advantages[batch.loss_mask == 0] == 0)
    assert set(m) == {"distill_reverse_kl", "distill_teacher_logprob"}


def test_a_zero_advantage_sequence_trains_under_distillation(tiny_llama, sharp_teacher):
    ros = make_rollouts(4, seed=2, env_tokens=False)
    for r in ros:
        r.advantage = 0.0  # a group with equal rewards: no GRPO signal
    plain = Trainer(tiny_llama, TrainCfg())
    m0 = plain.train_step(TrainBatch.from_rollouts(ros, 64), LOSSES["grpo"], LossConfig())
    assert m0["zero_adv_sequences"] == 4 - 1  # skipped (one kept for the gap metrics), gradient exactly 0
    assert m0["grad_norm"] == 0
    tr = Trainer(tiny_llama, TrainCfg(), distill=DistillOptions(str(sharp_teacher)))
    m = tr.train_step(TrainBatch.from_rollouts(ros, 64), LOSSES["grpo"], LossConfig())
    assert m["zero_adv_sequences"] == 0 and m["grad_norm"] > 0
    assert m["distill_reverse_kl"] != 0 and m["teacher_s"] > 0


def TrainCfg():
    from rollwise.config import TrainConfig

    return TrainConfig(lr=1e-3, bf16=False)


def test_distillation_lowers_the_reverse_kl_to_the_teacher(tiny_llama, sharp_teacher):
    """Sampled from the policy, scored by the teacher, trained on the per-token advantage: the reverse KL, measured
    exactly over the vocabulary after each prompt, falls."""
    from rollwise.types import Rollout

    tr = Trainer(tiny_llama, TrainCfg(), distill=DistillOptions(str(sharp_teacher)))
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, 64, (4,), generator=g).tolist() for _ in range(4)]

    def exact_kl():
        with torch.no_grad():
            ids = torch.tensor(prompts)
            p = torch.log_softmax(tr.model(input_ids=ids).logits[:, -1].float(), -1)
            q = torch.log_softmax(tr.teacher(input_ids=ids).logits[:, -1].float(), -1)
            return float((p.exp() * (p - q)).sum(-1).mean())

    before = exact_kl()
    for step in range(30):
        ros = []
        with torch.no_grad():
            for gi, pr in enumerate(prompts):
                ids = torch.tensor([pr])
                ls = torch.log_softmax(tr.model(input_ids=ids).logits[0, -1].float(), -1)
                toks = torch.multinomial(ls.exp(), 8, replacement=True, generator=g).tolist()
                for k, t in enumerate(toks):
                    ros.append(Rollout(prompt_id=str(gi), group_id=str(gi), sample_index=k, prompt_token_ids=pr,
                                       completion_token_ids=[t], logprobs=[float(ls[t])], weight_versions=[0],
                                       loss_mask=[1], advantage=0.0))
        tr.train_step(TrainBatch.from_rollouts(ros, 256), LOSSES["grpo"], LossConfig())
    after = exact_kl()
    assert after < 0.5 * before, (before, after)


def test_a_missing_teacher_is_one_line(tiny_llama, tmp_path):
    with pytest.raises(TrainerError, match=r"^algo.distill.teacher: "):
        Trainer(tiny_llama, distill=DistillOptions(str(tmp_path / "nowhere")))


def test_teacher_of_another_architecture_runs_beside_the_policy(tiny_llama, tmp_path):
    """The teacher's own flags (plain head, shared-prompt rows) are used for its forward, not the policy's."""
    teacher = build_tiny_llama(tmp_path / "eager", seed=5, attn="eager")
    tr = Trainer(tiny_llama, distill=DistillOptions(str(teacher)))
    ros = _groups([(3, [2, 5]), (4, [3])])
    from transformers import AutoModelForCausalLM

    ref = AutoModelForCausalLM.from_pretrained(teacher, dtype=torch.float32)
    batch = TrainBatch.from_rollouts(ros, 64)
    with torch.no_grad():
        want = naive_logprobs(ref, ros, batch.max_completion_len)
    torch.testing.assert_close(tr.teacher_logprobs(batch), want, atol=2e-5, rtol=0)


def test_a_bf16_trainer_holds_its_teacher_in_bf16(tiny_llama, sharp_teacher):
    from rollwise.config import TrainConfig

    f32 = Trainer(tiny_llama, TrainConfig(bf16=False), distill=DistillOptions(str(sharp_teacher)))
    bf = Trainer(tiny_llama, TrainConfig(bf16=True), distill=DistillOptions(str(sharp_teacher)))
    assert bf.teacher is not None and {p.dtype for p in bf.teacher.parameters()} == {torch.bfloat16}
    batch = TrainBatch.from_rollouts(make_rollouts(6, seed=5), 64)
    torch.testing.assert_close(bf.teacher_logprobs(batch), f32.teacher_logprobs(batch), atol=0.1, rtol=0)
