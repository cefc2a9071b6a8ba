"""A traffic mix in the plan: [[request.classes]] inherit [request], and what cannot be mixed is
refused with one line naming the file, the class and the key."""

from __future__ import annotations

import tomllib

import pytest

from kneeswarm.contracts.classes import classes_of, shares
from kneeswarm.contracts.plan import PlanError
from kneeswarm.contracts.planfile import load_plan, plan_from_dict

MIX = """
protocol = "kserve"
[request]
model = "cheap"
shape = [1, 16]
[[request.classes]]
name = "cheap"
weight = 3
[[request.classes]]
name = "slow"
weight = 1
model = "slow"
shape = [2, 8]
"""


def test_classes_inherit_request_and_override_their_own_keys(tmp_path):
    path = tmp_path / "plan.toml"
    path.write_text(MIX)
    classes = classes_of(load_plan(path))
    assert [(c.name, c.weight, c.request.model, c.request.shape) for c in classes] == [
        ("cheap", 3.0, "cheap", [1, 16]), ("slow", 1.0, "slow", [2, 8])]
    assert classes[1].keys == ("model", "shape")
    assert shares(classes) == {"cheap": 0.75, "slow": 0.25}


def test_a_mix_round_trips_through_the_resolved_plan(tmp_path):
    path = tmp_path / "plan.toml"
    path.write_text(MIX)
    plan = load_plan(path)
    again = plan_from_dict(tomllib.loads(plan.to_toml()))
    assert [(c.name, c.weight, c.request.model) for c in classes_of(again)] == \
        [(c.name, c.weight, c.request.model) for c in classes_of(plan)]


def test_a_plan_without_classes_has_no_mix():
    assert classes_of(plan_from_dict({})) == []


@pytest.mark.parametrize("protocol, classes, message", [
    ("kserve", [{"name": "a", "weight": 0}], "request.classes[0] (a): weight must be a number > 0, got 0"),
    ("kserve", [{"name": "a", "weight": -1.5}], "weight must be a number > 0"),
    ("kserve", [{"name": "a", "weight": "heavy"}], "weight must be a number > 0"),
    ("kserve", [{"name": "a"}, {"name": "a"}], "request.classes[1] (a): the name 'a' is given twice"),
    ("kserve", [{"weight": 1}], "request.classes[0]: needs a name"),
    ("kserve", [{"name": "a", "colour": "red"}], "request.classes[0] (a): unknown key 'colour'"),
    ("kserve", [{"name": "a", "max_tokens": 8}], "request.max_tokens cannot differ between classes for protocol 'kserve'"),
    ("openai", [{"name": "a", "shape": [1, 2]}], "request.shape cannot differ between classes for protocol 'openai'"),
    ("openai", [{"name": "a", "timeout": 3.0}], "request.timeout cannot differ between classes"),
    ("openai", [{"name": "a", "max_tokens": 0}], "request.classes[0] (a): request.max_tokens and request.prompt_tokens must be >= 1"),
    ("openai", [{"name": "a", "max_tokens": "many"}], "request.classes[0] (a).max_tokens must be int"),
    ("kserve", [{"name": "a", "shape": [0, 4]}], "request.classes[0] (a): request.shape must be positive dimensions"),
    ("openai", [{"name": "a", "lora": [{"id": -1}]}], "request.lora[0] must be {id = N >= 0, scale = number}"),
    ("kserve", [], "request.classes is empty"),
])
def test_a_bad_class_is_one_line_naming_the_class_and_the_key(protocol, classes, message):
    with pytest.raises(PlanError) as e:
        plan_from_dict({"protocol": protocol, "request": {"classes": classes}}, "mix.toml")
    text = str(e.value)
    assert text.startswith("mix.toml: ") and message in text and "\n" not in text


def test_a_mix_is_refused_beside_a_replay_and_on_grpc():
    with pytest.raises(PlanError, match="request.replay decides every request itself"):
        plan_from_dict({"protocol": "openai", "request": {"replay": "x.jsonl", "classes": [{"name": "a"}]}})
    with pytest.raises(PlanError, match="protocol 'kserve-grpc' cannot mix classes yet"):
        plan_from_dict({"protocol": "kserve-grpc", "target": "grpc://127.0.0.1:1",
                        "request": {"classes": [{"name": "a"}]}})


def test_lora_is_for_openai():
    with pytest.raises(PlanError, match="request.lora .* is for protocol 'openai'"):
        plan_from_dict({"protocol": "kserve", "request": {"lora": [{"id": 0}]}})
    plan = plan_from_dict({"protocol": "openai", "request": {"classes": [
        {"name": "base"}, {"name": "ad1", "lora": [{"id": 0, "scale": 1.0}]}]}})
    assert [c.request.lora for c in classes_of(plan)] == [None, [{"id": 0, "scale": 1.0}]]


@pytest.mark.parametrize("sla, message", [
    ({"classes": {"nope": {"p99_ms": 10}}}, "sla.classes.nope: no class 'nope' in [[request.classes]]"),
    ({"classes": {"a": {"p95_ms": 10}}}, "sla.classes.a: unknown key 'p95_ms'"),
    ({"classes": {"a": {"error_rate": 2}}}, "sla.classes.a.error_rate must be a number >= 0 and <= 1"),
    ({"classes": {"a": 5}}, "sla.classes.a must be a table of limits"),
])
def test_a_bad_class_sla_is_one_line(sla, message):
    with pytest.raises(PlanError) as e:
        plan_from_dict({"request": {"classes": [{"name": "a"}]}, "sla": sla}, "mix.toml")
    assert str(e.value) == f"mix.toml: {message}" or message in str(e.value)


def test_a_class_sla_reads_back():
    plan = plan_from_dict({"request": {"classes": [{"name": "a"}, {"name": "b"}]},
                           "sla": {"p99_ms": 100, "classes": {"b": {"p99_ms": 20.0}}}})
    assert plan.sla.classes == {"b": {"p99_ms": 20.0}} and plan.sla.is_set()
    assert tomllib.loads(plan.to_toml())["sla"]["classes"] == {"b": {"p99_ms": 20.0}}
