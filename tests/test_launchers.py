"""The launchers' small parts, without processes: `kneeswarm worker`'s command line, the start
form's plan fields, the master's "how many workers came"."""

from __future__ import annotations

import argparse
import sys

import pytest

from kneeswarm.launch.cli import main, worker_argv
from kneeswarm.launch.conductor import workers_connected
from kneeswarm.contracts.rundir import RunDir
from kneeswarm.locustfiles.webui import form_overrides


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


def test_workers_connected_from_the_masters_own_account(tmp_path):
    """The master's account of its workers (generator/master.json, written from Locust's
    worker_connect and test_start events), read by the conductor instead of Locust's log wording:
    the end-to-end case is tests/test_distributed.py::test_run_names_how_many_workers_came."""
    from kneeswarm.locustfiles.master_state import MasterState

    run = RunDir.create(tmp_path, "state")
    assert workers_connected(run) is None  # no account: nothing is claimed
    env = argparse.Namespace(parsed_options=argparse.Namespace(kneeswarm_run_dir=str(run.path), expect_workers=3))
    state = MasterState(env)
    assert workers_connected(run) == 0
    state.connected("a")
    state.connected("b")
    state.connected("c")
    state.gone("c")  # went missing before the test could start
    assert workers_connected(run) == 2
    state.test_started()
    assert workers_connected(run) is None  # they came in the end: the test started
    bare = MasterState(argparse.Namespace(parsed_options=argparse.Namespace(kneeswarm_run_dir="", expect_workers=1)))
    assert bare.path is None  # no conductor: nobody reads it, nothing written