"""The plan contract: strict parsing, one-line errors, a resolved plan that reads back the same."""

from __future__ import annotations

import tomllib

import pytest

from kneeswarm.contracts.plan import Plan, PlanError
from kneeswarm.contracts.planfile import load_plan, plan_from_dict


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


# -- [sla] and [capacity] (the SLA gate and the capacity plan) ------------------------------------------
GATES = ("[sla]\np99_ms = 250\nerror_rate = 0.01\nttft_ms = 400\nitl_ms = 40\nmin_qps = 50\n"
         "[capacity]\npeak_qps = 1000\nspare = 2\nqueue_tolerance_ms = 500\nheadroom = 0.3\nsafe_fraction = 0.7\n")


def test_sla_and_capacity_round_trip_through_the_resolved_plan(tmp_path):
    path = tmp_path / "p.toml"
    path.write_text(GATES)
    plan = load_plan(path)
    assert plan.sla.is_set() and plan.sla.p99_ms == 250.0 and plan.capacity.spare == 2
    written = tomllib.loads(plan.to_toml())
    assert written["sla"] == {"p99_ms": 250.0, "error_rate": 0.01, "ttft_ms": 400.0, "itl_ms": 40.0, "min_qps": 50.0}
    assert written["capacity"] == {"peak_qps": 1000.0, "spare": 2, "queue_tolerance_ms": 500.0, "headroom": 0.3,
                                   "safe_fraction": 0.7}
    assert plan_from_dict(written) == plan


def test_absent_sla_is_not_set_and_writes_no_limits():
    plan = load_plan(None)
    assert not plan.sla.is_set()
    written = tomllib.loads(plan.to_toml())
    assert written.get("sla", {}) == {} and written.get("capacity", {}) == {}


def test_sla_flags_override_the_file(tmp_path):
    path = tmp_path / "p.toml"
    path.write_text(GATES)
    assert load_plan(path, {"sla.p99_ms": 100.0, "sla.error_rate": None}).sla.p99_ms == 100.0


@pytest.mark.parametrize("text, message", [
    ("[sla]\np95_ms = 1\n", "unknown key 'sla.p95_ms'"),
    ("[sla]\np99_ms = 0\n", "sla.p99_ms must be > 0, got 0"),
    ("[sla]\np99_ms = 'fast'\n", "sla.p99_ms must be float"),
    ("[sla]\nerror_rate = 1.5\n", "sla.error_rate must be >= 0 and <= 1, got 1.5"),
    ("[sla]\nttft_ms = -1\n", "sla.ttft_ms must be > 0"),
    ("[sla]\nitl_ms = nan\n", "sla.itl_ms must be > 0"),
    ("[sla]\nmin_qps = -3\n", "sla.min_qps must be >= 0"),
    ("sla = 5\n", "[sla] must be a table"),
    ("[capacity]\nreplicas = 3\n", "unknown key 'capacity.replicas'"),
    ("[capacity]\npeak_qps = 0\n", "capacity.peak_qps must be > 0"),
    ("[capacity]\nspare = 1.5\n", "capacity.spare must be int"),
    ("[capacity]\nspare = -1\n", "capacity.spare must be >= 0"),
    ("[capacity]\nheadroom = 1.2\n", "capacity.headroom must be >= 0 and <= 1"),
    ("[capacity]\nsafe_fraction = 0\n", "capacity.safe_fraction must be > 0 and <= 1"),
    ("[capacity]\nqueue_tolerance_ms = -5\n", "capacity.queue_tolerance_ms must be >= 0"),
])
def test_bad_sla_or_capacity_is_one_line_naming_the_key(tmp_path, text, message):
    path = tmp_path / "p.toml"
    path.write_text(text)
    with pytest.raises(PlanError) as e:
        load_plan(path)
    assert message in str(e.value) and str(path) in str(e.value) and "\n" not in str(e.value)
