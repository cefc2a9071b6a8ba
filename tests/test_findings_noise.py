"""Real runs judged against their own noise: a finding at its threshold is marginal, never critical.

The USL target (kneeswarm.target --mode usl) serves X(N) = N / (T (1 + σ(N − 1) + κ N (N − 1))) in a
closed loop; κ is set so that QPS at 4 users sits 5 % below its peak at 3 (the retrograde rule's
threshold), measured: the client's own turn-around adds a few ms to every request, which the
closed form does not have, so κ is chosen for the drop the rows show (``MARGINAL_KAPPA``).  The
other test of the pair, the same target with a drop of a third (κ 0.1), is confirmed in every
resample (tests/test_findings_real.py ``test_a_curve_falling_past_its_peak_is_retrograde``).
"""

from __future__ import annotations

import pytest

from test_findings_real import USL_S, USL_T_MS, short_run

# X4/X3 = 4 (1 + 2σ + 6κ) / (3 (1 + 3σ + 12κ)): 0.95 at κ 0.1074 with no client time; the rows
# show ~1 % less drop than the closed form (measured here), so κ a little higher puts them at 5 %
MARGINAL_KAPPA = 0.112
HOLD_S = 12.0  # long enough that the rule's counting resolution (users / window) is below the 5 % drop


@pytest.mark.long
@pytest.mark.slow
def test_a_drop_at_the_retrograde_threshold_is_marginal_not_critical(start_demo_target, tmp_path):
    target = start_demo_target("--mode", "usl", "--sigma", str(USL_S), "--kappa", str(MARGINAL_KAPPA),
                               "--service-ms", str(USL_T_MS))
    summary, _ = short_run(target, tmp_path, "marginal", [1, 3, 4], **{"load.hold": HOLD_S})
    qps = {s["users"]: s["qps"] for s in summary["steps"] if s["valid"]}
    drop = 1 - qps[4] / qps[3]
    print("QPS:", qps, f"drop {drop:.2%}", summary["findings"], summary["findings_marginal"])
    assert max(qps, key=qps.get) == 3 and 0.035 <= drop <= 0.065, qps  # the drop the rows show: at the threshold
    assert "retrograde" not in {f["id"] for f in summary["findings"]}  # not confirmed, so never CRITICAL
    (retro,) = [f for f in summary["findings_marginal"] if f["id"] == "retrograde"]
    assert retro["severity"] == "warning" and 0.05 < retro["support"] < 0.95
    md = (tmp_path / "marginal").glob("*/report/summary.md")
    assert "### Marginal findings" in next(md).read_text()
