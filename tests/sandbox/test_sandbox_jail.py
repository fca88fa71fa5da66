"""The sandbox's plain behaviour: results, stdin, files, limits validation, and the loud fallback."""

from __future__ import annotations

import pytest

from rollwise.sandbox import Sandbox, SandboxLimits, SandboxUnavailable, jail


def test_runs_code_and_reports_exit_status(sandbox):
    res = sandbox.run_python("import sys\nprint(input()[::-1])\nsys.stderr.write('warn')\nsys.exit(3)", stdin="abc\n")
    assert (res.exit_code, res.stdout, res.stderr, res.timed_out, res.isolated) == (3, "cba\n", "warn", False, True)
    assert not res.ok


def test_files_are_visible_and_side_channel_is_read(sandbox):
    code = "import os\nos.write(int(os.environ['ROLLWISE_RESULT_FD']), open('data.txt').read().upper().encode())"
    res = sandbox.run_python(code, files={"data.txt": "verdict"})
    assert res.ok and res.side_channel == "VERDICT"


def test_bad_file_names_are_refused(sandbox):
    with pytest.raises(ValueError, match="plain names"):
        sandbox.run_python("pass", files={"../x": ""})


@pytest.mark.parametrize("kw", [{"wall_s": 0}, {"memory_mb": -1}, {"nproc": 0}, {"cpu_s": 0}, {"output_bytes": 0}])
def test_limits_are_validated(kw):
    with pytest.raises(ValueError, match="SandboxLimits"):
        SandboxLimits(**kw)


def test_isolation_mode_is_validated():
    with pytest.raises(ValueError, match="isolation"):
        Sandbox(isolation="maybe")  # type: ignore[arg-type]


def test_unavailable_isolation_warns_loudly_or_refuses(monkeypatch, capsys):
    monkeypatch.setattr(jail, "_status", (False, "simulated: no namespaces"))
    monkeypatch.setattr(jail, "_warned", False)
    with pytest.raises(SandboxUnavailable, match="simulated"):
        Sandbox(isolation="required")
    with pytest.warns(RuntimeWarning, match="UNAVAILABLE"):
        sb = Sandbox(isolation="auto")
    assert "ROLLWISE SANDBOX WARNING" in capsys.readouterr().err
    assert not sb.isolated
    res = sb.run_python("print(6 * 7)", limits=SandboxLimits(wall_s=5))
    assert res.stdout.strip() == "42" and res.isolated is False
    loop = sb.run_python("while True: pass", limits=SandboxLimits(wall_s=1))
    assert loop.timed_out  # the fallback still bounds time


def test_env_var_can_require_isolation(monkeypatch):
    monkeypatch.setattr(jail, "_status", (False, "simulated"))
    monkeypatch.setenv("ROLLWISE_SANDBOX", "required")
    with pytest.raises(SandboxUnavailable):
        Sandbox()


def test_concurrent_runs_do_not_interfere(sandbox):
    from concurrent.futures import ThreadPoolExecutor

    code = "import os\nopen('/tmp/f', 'w').write(str(os.getuid()))\nimport time; time.sleep(0.2)\nprint(open('/tmp/f').read())"
    with ThreadPoolExecutor(4) as ex:
        outs = list(ex.map(lambda _: sandbox.run_python(code).stdout.strip(), range(4)))
    assert len(set(outs)) == 4  # four jails, four uids, each read back its own file
