"""The tail of a step's generation and the useful / filtered / tail split: the pure functions on hand-made inputs,
then the driver measuring them on a fake engine whose every step costs one second of a fake clock."""

from __future__ import annotations

import pytest

from rollwise.control import Driver, PartialRolloutPolicy, RolloutController, UniformPolicy
from rollwise.control import driver as driver_mod
from rollwise.control.context import sample_params
from rollwise.control.driver import SampleRequest
from rollwise.control.ledger import Accounting
from rollwise.control.tail import WaveClock, split_generate, tail_time
from rollwise.types import SamplingParams
from tests.control.fakes import BatchOnlyEngine, FakeEngine, FakeEnv, FakeTokenizer, TaskStream, task

SP = SamplingParams(n=8, max_tokens=64, seed=1)


def test_tail_time_starts_at_the_nearest_rank_quantile_of_the_ends():
    ends = [float(t) for t in range(1, 11)]  # ten samples ending at 1 .. 10 s
    assert tail_time(ends, 20.0) == 11.0  # the 9th end (9 s) to the wave's end
    assert tail_time(list(reversed(ends)), 20.0) == 11.0  # order does not matter
    assert tail_time(ends, 20.0, quantile=1.0) == 10.0  # from the last end
    assert tail_time(ends, 20.0, quantile=0.5) == 15.0  # the 5th end
    assert tail_time([2.0] * 72 + [10.0] * 8, 10.0) == 8.0  # 90% of 80 is the 72nd end
    assert tail_time([1.0] * 8, 3.0) == 2.0  # eight samples: the 8th end (ceil(7.2))
    assert tail_time([], 5.0) == 0.0
    assert tail_time([4.0], 3.0) == 0.0  # never negative
    with pytest.raises(ValueError, match="quantile"):
        tail_time([1.0], 2.0, quantile=0.0)


def test_split_generate_adds_up_and_shares_the_rest_by_tokens():
    sp = split_generate(10.0, 4.0, generated_tokens=100, useful_tokens=25)
    assert (sp.useful_s, sp.filtered_s, sp.tail_s) == (1.5, 4.5, 4.0) and sp.total_s == 10.0
    assert split_generate(10.0, 0.0, 100, 150).useful_s == 10.0  # carried-in tokens: the share is capped at 1
    assert split_generate(10.0, 2.0, 0, 0) == split_generate(10.0, 2.0, 10, 0)  # nothing useful: all filtered
    capped = split_generate(3.0, 5.0, 10, 5)  # a tail longer than the phase is the whole phase
    assert (capped.tail_s, capped.useful_s, capped.filtered_s) == (3.0, 0.0, 0.0)


def test_wave_clock_sums_the_tails_of_its_waves():
    w = WaveClock()
    assert w.total(9.0) is None  # nothing observed: no tail to report
    w.ended(9, 1.0)
    w.ended(1, 5.0)
    w.close_wave(5.0)  # wave 1: 90% ended at 1 s, closed at 5 s
    w.ended(10, 7.0)
    w.close_wave(7.0)  # wave 2: all ended together, no tail
    w.ended(9, 8.0)
    assert w.tail_s == 4.0 and w.total(9.5) == 5.5  # an open wave counts up to now


def test_accounting_logs_the_split_only_where_the_tail_is_observed():
    acc = Accounting(gen_s=10.0, generated_tokens=100, useful_tokens=25)
    assert "time_tail_s" not in acc.metrics()
    acc.tail_s = 4.0
    m = acc.metrics()
    assert m["time_tail_s"] == 4.0 and m["tail_frac"] == 0.4
    assert (m["time_gen_useful_s"], m["time_gen_filtered_s"]) == (1.5, 4.5)


class _Clock:
    """Stands in for the driver's `time` module: a clock only the engine moves."""

    def __init__(self) -> None:
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now


class ClockedEngine(FakeEngine):
    """FakeEngine whose every step takes one second of `clock`."""

    def __init__(self, tasks, clock: _Clock) -> None:
        super().__init__(tasks)
        self.clock = clock

    def step(self):
        self.clock.now += 1.0
        return super().step()


@pytest.fixture
def clock(monkeypatch):
    c = _Clock()
    monkeypatch.setattr(driver_mod, "time", c)
    return c


def test_the_controller_measures_the_tail_of_a_step(clock):
    # nine groups of 2-token samples and one of 10: 72 of 80 samples end at 2 s, the step's generation at 10 s
    tasks = [task(i, 0.5, length=2) for i in range(9)] + [task(9, 0.5, length=10)]
    ctl = RolloutController(UniformPolicy(), FakeEnv(), FakeTokenizer(), score_workers=2)
    res = ctl.run_step(ClockedEngine(tasks, clock), TaskStream(tasks), SP, step=1, batch_groups=10)
    acc = res.accounting
    assert acc.gen_s == 10.0 and acc.tail_s == 8.0
    ctl.finalize(res, trained_version=0)
    m = acc.metrics()
    assert m["tail_frac"] == 0.8
    assert m["time_gen_useful_s"] + m["time_gen_filtered_s"] + m["time_tail_s"] == pytest.approx(10.0)
    assert m["time_gen_useful_s"] == pytest.approx(2.0 * acc.useful_tokens / acc.generated_tokens)


def test_each_wave_has_its_own_tail(clock):
    tasks = [task(0, 0.5, length=1), task(1, 0.5, length=5)]
    drv = Driver(ClockedEngine(tasks, clock))

    def wave(index: int) -> None:
        # 9 one-token samples and one of 5 tokens: 90% ended after 1 s of a 5 s wave
        prompt = FakeTokenizer().encode(tasks[0].prompt)
        long_prompt = FakeTokenizer().encode(tasks[1].prompt)
        drv.run([SampleRequest(f"w{index}a", 0, 9, prompt, sample_params(SP, 0, 0, 9)),
                 SampleRequest(f"w{index}b", 0, 1, long_prompt, sample_params(SP, 1, 0, 1))])

    wave(0)
    wave(1)
    assert drv.gen_s == 10.0 and drv.tail_s == 8.0
    drv.reset()
    assert drv.tail_s is None


def test_samples_stopped_to_be_carried_end_when_they_are_stopped(clock):
    # partial rollouts stop the step once 2 of 4 groups are done: the 40-token samples leave at the abort
    tasks = [task(0, 0.5, length=2), task(1, 0.5, length=2), task(2, 0.5, length=40), task(3, 0.5, length=40)]
    ctl = RolloutController(PartialRolloutPolicy(over_provision=1.0), FakeEnv(), FakeTokenizer(), score_workers=2)
    res = ctl.run_step(ClockedEngine(tasks, clock), TaskStream(tasks), SP, step=1, batch_groups=2)
    assert res.accounting.gen_s == 2.0 and res.accounting.carried_out_tokens > 0
    assert res.accounting.tail_s == 0.0  # half the samples end at the abort, with the generation: no tail


def test_batch_engines_report_no_tail():
    tasks = [task(0, 0.5)]
    ctl = RolloutController(UniformPolicy(), FakeEnv(), FakeTokenizer(), score_workers=2)
    res = ctl.run_step(BatchOnlyEngine(tasks), TaskStream(tasks), SP, step=1, batch_groups=1)
    assert res.accounting.tail_s is None and "time_tail_s" not in res.accounting.metrics()
