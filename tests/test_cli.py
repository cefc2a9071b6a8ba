"""Bad input gets one clear line and exit code 2, and leaves no run directory behind."""

from __future__ import annotations

import pytest

from kneeswarm.launch import cli, conductor

from conftest import one_error_line, run_cli


@pytest.fixture(autouse=True)
def quick_health(monkeypatch):
    monkeypatch.setattr(conductor, "HEALTH_TIMEOUT", 1.0)


def test_plan_with_unknown_key(tmp_path, capsys):
    plan = tmp_path / "p.toml"
    plan.write_text("[load]\nsteps = [1, 2]\nwarmup = 3\n")
    assert cli.main(["run", str(plan), "--out", str(tmp_path / "runs")]) == 2
    assert f"{plan}: unknown key 'load.warmup'" in one_error_line(capsys)
    assert not (tmp_path / "runs").exists()


def test_plan_with_wrong_type(tmp_path, capsys):
    plan = tmp_path / "p.toml"
    plan.write_text("[load]\nworkers = 'two'\n")
    assert cli.main(["run", str(plan)]) == 2
    assert "load.workers must be int" in one_error_line(capsys)


@pytest.mark.parametrize("steps, message", [("4,2,8", "strictly increasing"), (",", "load.steps is empty")])
def test_bad_step_lists(tmp_path, capsys, steps, message):
    assert cli.main(["run", "--steps", steps, "--out", str(tmp_path)]) == 2
    assert message in one_error_line(capsys)


def test_target_that_does_not_answer(tmp_path, capsys):
    port = conductor.free_port()
    assert cli.main(["run", "--target", f"http://127.0.0.1:{port}", "--out", str(tmp_path)]) == 2
    line = one_error_line(capsys)
    assert f"target http://127.0.0.1:{port}: health check" in line and "connection refused" in line
    assert list(tmp_path.iterdir()) == []


def test_target_answering_errors_to_health_check(tmp_path, capsys, start_demo_target):
    t = start_demo_target("--mode", "knee")
    assert cli.main(["run", "--target", t.url + "/nope", "--out", str(tmp_path)]) == 2
    assert "HTTP 404" in one_error_line(capsys)


def test_pid_that_does_not_exist(tmp_path, capsys, start_demo_target):
    t = start_demo_target("--mode", "knee")
    assert cli.main(["run", "--target", t.url, "--pid", "999999", "--out", str(tmp_path)]) == 2
    line = one_error_line(capsys)
    assert "999999" in line
    assert list(tmp_path.iterdir()) == []  # nothing half-written that looks like a run


def test_process_regex_matching_nothing(tmp_path, capsys, start_demo_target):
    t = start_demo_target("--mode", "knee")
    assert cli.main(["run", "--target", t.url, "--process", "no-such-server-xyz", "--out", str(tmp_path)]) == 2
    assert "no-such-server-xyz" in one_error_line(capsys)
    assert list(tmp_path.iterdir()) == []


def test_analyze_on_a_path_that_is_not_a_run(tmp_path, capsys):
    assert cli.main(["analyze", str(tmp_path)]) == 2
    assert "not a kneeswarm run directory" in one_error_line(capsys)


def test_console_script_help_documents_every_run_flag():
    res = run_cli("run", "--help", timeout=60)
    assert res.returncode == 0
    for flag in ("--target", "--protocol", "--model", "--steps", "--hold", "--ramp", "--settle", "--workers",
                 "--pid", "--process", "--out", "--name"):
        assert flag in res.stdout


def test_help_speaks_to_users_not_of_the_code_s_floors(capsys):
    # The parser's description is the module docstring's first paragraph: no developer's plan in it.
    for command in ([], ["run"], ["demo"], ["analyze"], ["compare"], ["history"], ["worker"]):
        with pytest.raises(SystemExit):
            cli.main([*command, "--help"])
        out = capsys.readouterr().out
        assert out.startswith("usage: kneeswarm") and "floor" not in out.lower(), (command, out)


def test_demo_target_that_fails_to_start_is_one_error_not_a_hang():
    with pytest.raises(RuntimeError, match="did not start"):
        cli.start_target(["--mode", "no-such-mode"], timeout=30)
