"""Two mixes compared class by class: each class's point figures at the steps valid in both."""

from __future__ import annotations

import math

import numpy as np
import pytest

from kneeswarm.analysis.reports.mix_report import classes_lines
from kneeswarm.analysis.runs.compare_classes import classes_change


def summary(slow_p99: list[float], took_off: int | None) -> dict:
    steps = lambda p99s, valid=(True, True, True): [  # noqa: E731
        {"users": u, "qps": 10.0 * u, "p99_ms": p, "valid": v} for u, p, v in zip((1, 2, 4), p99s, valid)]
    return {"mix": {"classes": [
        {"name": "cheap", "steps": steps([5.0, 5.0, 6.0]), "latency_knee": {"took_off_users": None}, "knee": {"users": 4}},
        {"name": "slow", "steps": steps(slow_p99, (True, True, False)), "latency_knee": {"took_off_users": took_off},
         "knee": {"users": 2}}]}}


def test_each_class_s_change_at_the_steps_valid_in_both():
    got = classes_change(summary([40.0, 50.0, 90.0], 4), summary([40.0, 100.0, 300.0], 2))
    assert [c["name"] for c in got] == ["cheap", "slow"]
    slow = got[1]
    assert [s["users"] for s in slow["steps"]] == [1, 2]  # 4 users is not valid
    assert slow["steps"][1]["p99_ms"] == [50.0, 100.0] and slow["steps"][1]["p99_rel"] == pytest.approx(1.0)
    assert slow["latency_knee"] == [4, 2]
    text = "\n".join(classes_lines(got))
    assert "| slow | 2 | 20.0 | 20.0 | +0.0% | 50.0 | 100.0 | +100.0% | – |" in text  # no rows read: no interval


def test_no_mix_on_either_side_no_classes():
    assert classes_change({}, summary([1.0, 1.0, 1.0], None)) == []


# -- each class's steps bootstrapped and judged as the whole's are -----------------------------------
#: Rows drawn as tests/test_compare.py draws them (Poisson arrivals of RATE x users, exponential
#: latencies), each given a class, half and half: "long" (mean 100 ms) and "short" (mean 10 ms).
#: The whole's P99 is long's tail (100 ms x ln 50 = 391 ms); short's P99 is 10 ms x ln 100 = 46 ms.
#: Short has about 1,000, 2,000 and 4,000 rows at 1, 2 and 4 users: its P99 gets an interval from
#: 2,000 (bootstrap.MIN_ROWS_CLASS_P99).
#: Measured (12 pairs of one configuration, 6 of short slowed 2x, seeds other than these): no pair
#: of the same configuration called anything changed (97 of 102 class intervals held 0); every
#: slowed pair regressed by short's P99 while the whole's steps held; width / (2 x 1.96 analytic sd)
#: 0.78-1.40.
MIX_USERS = (1, 2, 4)
MIX_RATE, MIX_HOLD, T0 = 100.0, 20.0, 1_700_000_000.0
SHARES, MEANS = {"long": 0.5, "short": 0.5}, {"long": 100.0, "short": 10.0}
Z = 1.959964
def make_mix_run(root, name: str, seed: int, short_slow: float = 1.0, shares: dict[str, float] = SHARES):
    from kneeswarm.contracts.rundir import RunDir
    from tests.test_compare import write_drawn_run

    rd = RunDir.create(root, name)
    rng = np.random.default_rng(seed)
    cols: dict[str, list] = {k: [] for k in ("t_start", "latency_ms", "ok", "status", "step", "users", "worker", "class")}
    steps, t, counts = [], T0, {}
    for i, u in enumerate(MIX_USERS):
        t_steady, t_end = t + 1.0, t + 1.0 + MIX_HOLD
        n = rng.poisson(MIX_RATE * u * MIX_HOLD)
        cls = rng.choice(list(shares), size=n, p=list(shares.values()))
        means = np.where(cls == "short", MEANS["short"] * short_slow, MEANS["long"])
        cols["t_start"] += list(np.sort(rng.uniform(t_steady, t_end, n)))
        cols["latency_ms"] += list(rng.exponential(means))
        cols["class"] += list(cls)
        cols["ok"] += [True] * n
        cols["status"] += [200] * n
        cols["step"] += [i] * n
        cols["users"] += [u] * n
        cols["worker"] += ["worker-0"] * n
        counts[u] = {c: int((cls == c).sum()) for c in shares}
        steps.append((i, u, t, t_steady, t_end))
        t = t_end
    return write_drawn_run(rd, name, cols, steps), counts


#: Short at 20 %: 400-1,600 rows a step.  Judged like the whole (every P99 with 20 rows or more
#: interval'd), these two pairs of one configuration were each called "regressed" by short's P99
#: (+44.7 % at 1 user, CI [+5.4, +27.3] ms; +21.1 % at 4 users): the bootstrap of a P99 over a
#: handful of rows above it is too narrow.  The first pair also called short's QPS worse at 1 user
#: (-14.8 %, CI [-6.1, -0.50] req/s): Holm over the comparison's class changes clears that one.
FEW_SHORT, FALSE_ALARMS = {"long": 0.8, "short": 0.2}, [(101, 201), (106, 206)]


@pytest.fixture(scope="module")
def mix_runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("mixes")
    runs = {"base": make_mix_run(root, "base", 1), "same": make_mix_run(root, "same", 2),
            "short_slow": make_mix_run(root, "short_slow", 3, short_slow=2.0)}
    for a, b in FALSE_ALARMS:
        runs[f"few-{a}"] = make_mix_run(root, f"few-{a}", a, shares=FEW_SHORT)
        runs[f"few-{b}"] = make_mix_run(root, f"few-{b}", b, shares=FEW_SHORT)
    return runs


def test_a_minority_class_that_slowed_regresses_the_run_where_the_whole_held(mix_runs, tmp_path):
    from kneeswarm.analysis.runs.compare import NO_CHANGE, REGRESSED, compare_runs, write_outputs
    from kneeswarm.launch import cli

    (base, base_n), (new, new_n) = mix_runs["base"], mix_runs["short_slow"]
    got = compare_runs(base, new)
    assert {s["verdict"] for s in got["steps"]} == {NO_CHANGE}  # the whole's P99 is long's tail: it hid it
    assert got["verdict"] == REGRESSED
    short, long_ = (next(c for c in got["classes"] if c["name"] == n) for n in ("short", "long"))
    assert short["verdict"] == REGRESSED and long_["verdict"] == NO_CHANGE
    judged = 0
    for s in short["steps"]:
        u, c = s["users"], s["p99_change"]
        assert not s["qps_change"]["significant"]  # its arrivals did not change
        if min(base_n[u]["short"], new_n[u]["short"]) < 2000:  # too few rows above its P99 to judge it
            assert c["ci"] is None and not c["significant"], (u, c)
            continue
        judged += 1
        assert c["direction"] == "worse" and s["verdict"] == REGRESSED
        # truth: the P99 doubled, +10 ms x ln 100; the interval's width is the asymptotic one of two
        # independent sample P99s of exponentials (variance 99 mu^2 / n each)
        lo, hi = c["ci"]
        sd = math.sqrt(99 * MEANS["short"] ** 2 / base_n[u]["short"] + 99 * (2 * MEANS["short"]) ** 2 / new_n[u]["short"])
        assert lo - sd <= 10.0 * math.log(100) <= hi + sd, (u, c)
        assert (hi - lo) == pytest.approx(2 * Z * sd, rel=0.45), (u, c, sd)
        assert c["p_holm"] < 0.05
        assert f"class short, {u:g} users: p99_ms" in " ".join(got["reasons"])
    assert judged >= 1
    assert all(not s["p99_change"]["significant"] and not s["qps_change"]["significant"] for s in long_["steps"])
    out = tmp_path / "out"
    write_outputs(got, out)
    md = (out / "compare.md").read_text()
    assert "| short | 4 | " in md and "**worse** | regressed |" in md
    junit = (out / "junit.xml").read_text()
    assert 'name="class short: 4 users p99_ms"' in junit and 'name="class long: 4 users p99_ms"' in junit
    assert junit.count("<failure") == sum(s["p99_change"]["direction"] == "worse" for s in short["steps"]) >= 1
    assert cli.main(["compare", str(base), str(new), "--fail-on-regression", "-q", "--out", str(tmp_path / "o")]) != 0


@pytest.mark.parametrize("pair", [("base", "same")] + [(f"few-{a}", f"few-{b}") for a, b in FALSE_ALARMS])
def test_the_same_mix_again_is_no_change_in_any_class(mix_runs, pair):
    from kneeswarm.analysis.runs.compare import NO_CHANGE, compare_runs

    got = compare_runs(mix_runs[pair[0]][0], mix_runs[pair[1]][0])
    assert got["verdict"] == NO_CHANGE, got["reasons"]
    for c in got["classes"]:
        assert c["verdict"] == NO_CHANGE
        for s in c["steps"]:
            for key in ("qps_change", "p99_change"):  # (a 95 % interval may miss 0: 1 in 20 does)
                assert not s[key]["significant"], (c["name"], s)
