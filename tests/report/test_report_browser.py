"""The report opened in headless Chromium: no errors, no network, every plot drawn, search and group view work."""

from __future__ import annotations

import importlib.util
import time
from pathlib import Path

import pytest

from rollwise.report import write_report

# Loaded by path, so the driver is found whatever pytest's import mode.
_spec = importlib.util.spec_from_file_location("rollwise_tests_chromium_cdp", Path(__file__).with_name("chromium_cdp.py"))
chromium_cdp = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(chromium_cdp)
pytest.importorskip("websocket", reason="websocket-client is needed to drive Chromium (pip install -e '.[dev]')")

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not chromium_cdp.available(), reason="/usr/bin/chromium missing: run .ci/setup.d/20-chromium.sh (apt-get install chromium)"),
]

EXPECTED_PLOTS = {
    "reward_step", "reward_wall", "resp_len_hist", "resp_len_step", "zero_var", "throughput", "time_split",
    "staleness", "logprob_mismatch", "status_by_step", "kl", "entropy", "grad_norm",
}  # fmt: skip


def test_report_in_headless_chromium(run_dir, tmp_path):
    report = write_report(run_dir)
    t0 = time.monotonic()
    with chromium_cdp.Chromium(tmp_path) as browser:
        # The generic checks (also usable on a real run directory): plots drawn, search, group view,
        # no console errors, no network; a screenshot in the test's tmp dir.
        seen = chromium_cdp.check_report(browser, report, screenshot=tmp_path / "report.png")
        assert EXPECTED_PLOTS <= set(seen["plots"]), EXPECTED_PLOTS - set(seen["plots"])
        assert seen["screenshot"].stat().st_size > 20_000
        assert browser.eval("document.querySelectorAll('figure.plot svg path.data').length") > 50

        # The card states the counts by status.
        counts = browser.eval(
            "Object.fromEntries(Array.from(document.querySelectorAll('#status-counts tr')).map(r => [r.cells[0].textContent, +r.cells[1].textContent]))"
        )
        assert counts["total"] == 20 * 24 and counts["errored"] == 3 and counts["truncated"] == 4

        # The browser lists the embedded groups (8 latest steps x 6 prompts), newest first.
        assert seen["groups"] == 8 * 6
        assert "embeds 192 of the 480 stored rollouts" in browser.eval("document.getElementById('embed-note').textContent")

        # Search by prompt text, typed as keyboard input.
        browser.type_into("#search", "61+17")
        shown = browser.eval("Array.from(document.querySelectorAll('#groups .group-item')).map(e => e.dataset.groupId)")
        assert len(shown) == 8 and all(g.endswith("-g5") for g in shown)
        assert browser.eval("document.getElementById('match-count').textContent").startswith("showing 8 of 8")

        # Opening a group (a real click) shows its samples with reward, advantage, status and shaded tokens.
        browser.click("#groups .group-item:nth-child(2)")
        view = browser.eval(
            """(() => { const v = document.getElementById('group-view');
                 return {id: v.dataset.groupId, samples: v.querySelectorAll('.sample').length,
                         rewards: Array.from(v.querySelectorAll('.sample .reward')).map(e => e.textContent),
                         advs: v.querySelectorAll('.sample .advantage').length,
                         statuses: Array.from(v.querySelectorAll('.sample .badge')).map(e => e.textContent),
                         shaded: Array.from(v.querySelectorAll('.tok:not(.env)')).filter(t => t.style.backgroundColor).length,
                         env: v.querySelectorAll('.tok.env').length,
                         prompt: v.querySelector('.prompt').textContent}; })()"""
        )
        assert view["id"] == shown[1] and view["samples"] == 4 and view["advs"] == 4
        assert all(r.startswith("reward ") for r in view["rewards"]) and set(view["statuses"]) <= {"kept", "truncated", "errored"}
        assert view["shaded"] > 8 and view["env"] == 3  # the multi-turn sample's tool tokens are marked
        assert view["prompt"] == "61+17="

        # The status filter narrows to groups with an errored sample.
        browser.type_into("#search", "")
        browser.eval("(() => { const s = document.getElementById('status-filter'); s.value = 'errored'; s.dispatchEvent(new Event('change')); })()")
        errored = browser.eval("Array.from(document.querySelectorAll('#groups .group-item')).map(e => e.dataset.groupId)")
        assert errored == ["s17-g1"]  # steps 3, 10, 17 errored; only 17 is embedded

        assert browser.errors() == []
    print(f"browser checks took {time.monotonic() - t0:.1f}s; screenshot {seen['screenshot']}")


def test_report_without_rollouts_or_summary_in_chromium(run_dir, tmp_path):
    """A run that crashed early: metrics only. The page must still load cleanly."""
    import shutil

    shutil.rmtree(run_dir / "rollouts")
    (run_dir / "summary.json").unlink()
    report = write_report(run_dir)
    with chromium_cdp.Chromium(tmp_path) as browser:
        seen = chromium_cdp.check_report(browser, report)
        assert seen["groups"] == 0 and "reward_step" in seen["plots"]
        assert "No rollouts embedded" in browser.eval("document.getElementById('group-view').textContent")
