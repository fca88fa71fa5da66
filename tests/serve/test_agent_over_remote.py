"""An agent function over a remote engine: the same recording endpoint sits in front of `RemoteEngine` (here
`rollwise serve`), and its episodes equal the in-process engine's token for token."""

from __future__ import annotations

import pytest

from rollwise import SamplingParams
from rollwise.clients.remote import RemoteEngine
from rollwise.envs.agent_endpoint import AgentEndpoint
from rollwise.envs.user_agent import AgentEpisodes, UserAgentEnv
from rollwise.models.prompting import PromptFormat
from rollwise.types import Score, Task
from serve_util import ADMIN_KEY

pytest.importorskip("openai")

TASKS = [Task("a", "12+34=", 46), Task("b", "5*6=", 30)]


class _Data:
    name = "toy"

    def load(self, split="train", n=None, seed=0):
        return TASKS

    def score(self, task, completion):
        return Score(float(completion.strip() == str(task.answer)))


def agent(client, row):
    first = client.completions.create(model="tiny", prompt=row["prompt"], max_tokens=4).choices[0].text
    return client.completions.create(model="tiny", prompt=row["prompt"] + first + "\n=", max_tokens=4).choices[0].text


def _episodes(engine, tok):
    runner = AgentEpisodes(UserAgentEnv(_Data(), agent, "agent"), AgentEndpoint(tok, PromptFormat()),
                           PromptFormat().task_encoder(tok), max_total_tokens=64)
    try:
        return runner.run(engine, TASKS, [SamplingParams(n=2, max_tokens=8, seed=3, temperature=0.9)] * 2)
    finally:
        runner.close()


def test_an_agent_over_a_remote_engine_records_what_the_in_process_engine_would(server, llm):
    remote, local = _episodes(RemoteEngine(server.url, api_key=ADMIN_KEY), llm.tokenizer), _episodes(llm, llm.tokenizer)
    assert len(remote) == len(local) == 4
    for a, b in zip(remote, local):
        assert a.score.error is None and b.score.error is None
        assert a.prompt_token_ids == b.prompt_token_ids and a.token_ids == b.token_ids and a.loss_mask == b.loss_mask
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs)) < 1e-4
        assert a.score.info["agent_extended"] == 1 and not a.segments
