"""The length x concurrency sweep (``[load] shapes``): three shapes against one engine-model
target whose KV cache puts each shape's knee at a known number of users, and the Pareto chart in
Chromium.

Independent truth: the target's KV arithmetic.  A cache of K = 400 tokens; a sequence of P prompt and
16 output tokens holds up to P + 16 and is admitted only while the cache keeps room for its prompt
plus a token per running sequence.  176 + 16: 2 fit (2 x 192 + 2 = 386 <= 400) and a 3rd never is
admitted (2 x 176 + 177 > 400): the knee at 2 users.  80 + 16: 4 fit (4 x 96 + 4 = 388), a 5th never
(4 x 80 + 81 > 400): 4 users.  8 + 16: 16 fit, beyond the last step (8 users): no knee below 8.
Steps of 5 ms keep each request short beside the ~1.4 s windows (Little's law holds at every step).
Locust moves a step only on its 1-s shape tick: a step whose users all run ~0.1 s after it began
and are then held 1.8 s ends at the tick 2 s after it began (held 2.5 s, it ran to the 3-s tick).
The fewest rows in a window, 176 + 16 at 1 user (about 10 req/s measured), about 14: over
min_requests (10); the knee rule's 20 % gain per doubling against true gains of 0 % and ~100 %.
Measured: knees 2 and 4, none for 8 + 16.
"""

from __future__ import annotations

import json
import tomllib

import pytest

from conftest import chromium_or_skip, chromium_page, run_cli

SHAPES = [[8, 16], [80, 16], [176, 16]]
KNEES = {176: 2, 80: 4}


@pytest.mark.long
@pytest.mark.slow
def test_three_shapes_give_a_knee_each_where_the_cache_puts_it_and_one_pareto_chart(tmp_path, start_demo_target):
    target = start_demo_target("--mode", "knee", "--kv-tokens", "400", "--max-batch", "64", "--decode-ms", "5")
    plan = tmp_path / "plan.toml"
    plan.write_text(f'name = "sweep"\ntarget = "{target.url}"\nprotocol = "openai"\n'
                    f"[load]\nsteps = [1, 2, 4, 8]\nramp = 0.3\nhold = 1.8\nsettle = 0.5\nworkers = 1\n"
                    f"shapes = {json.dumps(SHAPES)}\n[request]\nstream = true\n[analysis]\nmin_requests = 10\n")
    res = run_cli("run", str(plan), "--out", str(tmp_path / "runs"), "-q", timeout=400)
    assert res.returncode == 0, res.stderr[-3000:]
    dirs = sorted(p.name for p in (tmp_path / "runs").iterdir())
    assert len(dirs) == 4 and [d for d in dirs if d.endswith("-sweep-shapes")], dirs
    (sweep_dir,) = [p for p in (tmp_path / "runs").iterdir() if p.name.endswith("-shapes")]
    sweep = json.loads((sweep_dir / "sweep.json").read_text())
    got = {sh["input_tokens"]: sh for sh in sweep["shapes"]}
    print({k: (v["knee_users"], v["peak_tokens_s"]) for k, v in got.items()})
    assert [[sh["input_tokens"], sh["output_tokens"]] for sh in sweep["shapes"]] == SHAPES
    for inp, knee in KNEES.items():
        assert got[inp]["knee_users"] == knee, (inp, got[inp]["knee_users"])
    assert got[8]["knee_users"] in (None, 8)
    assert all(len(sh["points"]) == 4 for sh in sweep["shapes"])  # every step has its point (valid or not)
    # each run asked for its shape: prompts of that many words, outputs pinned to 2 tokens
    for sh in sweep["shapes"]:
        request = tomllib.loads((tmp_path / "runs" / sh["run_id"] / "plan.toml").read_text())["request"]
        assert (request["prompt_tokens"], request["max_tokens"], request["ignore_eos"]) == \
            (sh["input_tokens"], sh["output_tokens"], True) and sh["complete"]
    # the chart: one curve per shape in Chromium
    with chromium_page(chromium_or_skip(), (sweep_dir / "index.html").as_uri()) as (_, page):
        page.wait_for_selector("#pareto .scatterlayer", timeout=30_000)
        legend = page.eval_on_selector_all("#pareto .legendtext", "els => els.map(e => e.textContent)")
        curves = page.locator("#pareto .scatterlayer .trace").count()
    assert legend == [f"{a} in / {b} out" for a, b in SHAPES], legend
    assert curves == len(SHAPES) + len(KNEES)  # a curve per shape, a star per knee found


@pytest.mark.parametrize("load, req, message", [
    ({"shapes": [[128]]}, {}, "load.shapes must be [input, output] token pairs"),
    ({"shapes": [[128, 0]]}, {}, "load.shapes must be [input, output] token pairs"),
    ({"shapes": []}, {}, "load.shapes must be [input, output] token pairs"),
    ({"shapes": [[1, 2.5]]}, {}, "a list of [input, output] integer pairs"),
    ({"shapes": [[16, 16]]}, {"dataset": "x.jsonl"}, "synthetic prompts"),
])
def test_bad_shapes_are_one_line_naming_the_key(load, req, message):
    from kneeswarm.contracts.plan import PlanError
    from kneeswarm.contracts.planfile import plan_from_dict

    with pytest.raises(PlanError, match=message.replace("[", r"\[")):
        plan_from_dict({"protocol": "openai", "load": load, "request": req})
