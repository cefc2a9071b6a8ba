"""The launchers' small parts, without processes: `kneeswarm worker`'s command line, the start
form's plan fields, the master's "how many workers came"."""

from __future__ import annotations

import argparse
import sys

import pytest

from kneeswarm.cli import main, worker_argv
from kneeswarm.conductor import workers_connected
from locustfiles.webui import form_overrides


def test_worker_argv_is_locusts_worker_with_kneeswarms_locustfile():
    argv = worker_argv("10.0.0.2:6000", 3)
    assert argv[:3] == [sys.executable, "-m", "locust"] and argv[4].endswith("locustfiles/swarm.py")
    assert argv[5:] == ["--worker", "--master-host", "10.0.0.2", "--master-port", "6000", "--processes", "3"]
    assert worker_argv("master", None)[-4:] == ["--master-host", "master", "--master-port", "5557"]


def test_worker_with_a_bad_port_is_one_line_and_exit_2(capsys):
    assert main(["worker", "--master", "host:http"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--master 'host:http'" in err[0]


def test_form_fields_override_the_plan_and_a_bad_one_names_itself():
    form = {"kneeswarm_steps": "1, 2,4", "kneeswarm_hold": "7.5", "kneeswarm_model": "m", "kneeswarm_ramp": ""}
    assert form_overrides(form) == {"load.steps": [1, 2, 4], "load.hold": 7.5, "request.model": "m"}
    assert form_overrides(argparse.Namespace(kneeswarm_settle="1")) == {"load.settle": 1.0}
    with pytest.raises(ValueError, match="^hold: "):
        form_overrides({"kneeswarm_hold": "long"})


def test_workers_connected_from_the_masters_log(tmp_path):
    log = tmp_path / "master.log"
    log.write_text("x INFO/locust.main: Waiting for workers to be ready, 0 of 3 connected\n"
                   "x INFO/locust.main: Waiting for workers to be ready, 2 of 3 connected\n"
                   "x ERROR/locust.main: Gave up waiting for workers to connect\n")
    assert workers_connected(log) == 2
    log.write_text("x INFO/locust.main: Waiting for workers to be ready, 2 of 3 connected\n")
    assert workers_connected(log) is None  # they came in the end
    assert workers_connected(tmp_path / "none.log") is None
