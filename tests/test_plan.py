"""The plan contract: strict parsing, one-line errors, a resolved plan that reads back the same."""

from __future__ import annotations

import tomllib

import pytest

from kneeswarm.plan import Plan, PlanError, load_plan, plan_from_dict


def write(tmp_path, text: str):
    p = tmp_path / "plan.toml"
    p.write_text(text)
    return p


@pytest.mark.parametrize(
    "text, message",
    [
        ("[load]\nstepz = [1, 2]\n", "unknown key 'load.stepz'"),
        ("colour = 'red'\n", "unknown key 'colour'"),
        ("[load]\nsteps = [1, 'two']\n", "load.steps must be a list of integers"),
        ("[load]\nhold = 'long'\n", "load.hold must be float"),
        ("[load]\nsteps = []\n", "load.steps is empty"),
        ("[load]\nsteps = [1, 4, 2]\n", "load.steps must be strictly increasing"),
        ("[load]\nsteps = [1, 1]\n", "load.steps must be strictly increasing"),
        ("[load]\nsteps = [0, 1]\n", "load.steps must be positive"),
        ("[load]\nhold = 2\nsettle = 3\n", "load.settle (3.0s) must be shorter than load.hold"),
        ("protocol = 'grpc'\n", "protocol 'grpc' is not supported"),
        ("target = 'localhost:8000'\n", "target must be an http:// or https:// URL"),
        ("load = 3\n", "[load] must be a table"),
        ("[[hosts]]\nssh = 'a@b'\npid = 1\nport = 80\n", "give one of pid, process or port"),
        ("[[hosts]]\n[[hosts]]\n", "two [[hosts]] share a name"),
        ("[load\n", "not valid TOML"),
    ],
)
def test_bad_plan_is_one_line_naming_file_and_problem(tmp_path, text, message):
    path = write(tmp_path, text)
    with pytest.raises(PlanError) as e:
        load_plan(path)
    assert message in str(e.value)
    assert str(e.value).startswith(str(path))
    assert "\n" not in str(e.value)


def test_missing_file(tmp_path):
    with pytest.raises(PlanError, match="no such file"):
        load_plan(tmp_path / "nope.toml")


def test_flags_override_the_file(tmp_path):
    path = write(tmp_path, "name = 'x'\n[load]\nsteps = [1, 2, 4]\nhold = 5.0\n")
    plan = load_plan(path, {"load.steps": [2, 8], "load.ramp": None, "target": "http://127.0.0.1:9"})
    assert plan.load.steps == [2, 8] and plan.load.hold == 5.0 and plan.target == "http://127.0.0.1:9"
    assert plan.load.ramp == Plan().load.ramp  # None means "not given"


def test_resolved_plan_round_trips_through_toml():
    plan = plan_from_dict({"name": "rt", "load": {"steps": [1, 3]}, "hosts": [{"ssh": "u@h:2222", "collectors": ["vmstat"]}]})
    again = plan_from_dict(tomllib.loads(plan.to_toml()))
    assert again == plan
    assert again.hosts[0].label == "h"


def test_secrets_are_named_not_stored():
    plan = plan_from_dict({"hosts": [{"ssh": "u@h", "passphrase_env": "KEY_PASS"}]})
    text = plan.to_toml()
    assert 'passphrase_env = "KEY_PASS"' in text
