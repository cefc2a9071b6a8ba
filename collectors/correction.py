"""Clock corrections: a host's measured offset from the master, and host time -> master time.

Measured by ``kneeswarm.agents.clock`` (NTP/Cristian round trips over a live channel) before and after a
run; applied here, on the floor both the agents and analysis may use, so that raw host samples can
be put on the master's clock again from meta.json alone (``kneeswarm.collectors.parsed``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np


@dataclass
class ClockOffset:
    offset: float  # seconds, host clock minus master clock
    error: float  # bound on |true offset - offset|, seconds
    rtt_min: float
    rtt_median: float
    rounds: int
    kept: int
    t: float  # master time of the measurement

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ClockOffset:
        return cls(**{k: d[k] for k in cls.__dataclass_fields__})


@dataclass
class ClockCorrection:
    """Offsets measured before and after a run; maps host times onto the master's clock."""

    before: ClockOffset | None = None
    after: ClockOffset | None = None

    def offset_at(self, t_host: Any) -> Any:
        """θ at host time(s) t_host: linear between the two measurements, constant outside."""
        b, a = self.before, self.after
        if b is None and a is None:
            return np.zeros_like(np.asarray(t_host, dtype=float)) if np.ndim(t_host) else 0.0
        if b is None or a is None or a.t - b.t < 1e-3:
            only = b or a
            assert only is not None
            return np.full_like(np.asarray(t_host, dtype=float), only.offset) if np.ndim(t_host) else only.offset
        tb, ta = b.t + b.offset, a.t + a.offset  # measurement times on the host's clock
        return np.interp(t_host, [tb, ta], [b.offset, a.offset])

    def to_master(self, t_host: Any) -> Any:
        return np.asarray(t_host, dtype=float) - self.offset_at(t_host)

    @property
    def drift_ppm(self) -> float | None:
        if self.before is None or self.after is None or self.after.t - self.before.t < 1.0:
            return None
        return (self.after.offset - self.before.offset) / (self.after.t - self.before.t) * 1e6

    def to_dict(self) -> dict[str, Any]:
        return {
            "before": self.before.to_dict() if self.before else None,
            "after": self.after.to_dict() if self.after else None,
            "drift_ppm": self.drift_ppm,
            "applied": "t_master = t_host - offset (linear between before and after)",
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> ClockCorrection:
        d = d or {}
        return cls(
            before=ClockOffset.from_dict(d["before"]) if d.get("before") else None,
            after=ClockOffset.from_dict(d["after"]) if d.get("after") else None,
        )


__all__ = ["ClockCorrection", "ClockOffset"]
