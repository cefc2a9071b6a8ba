"""A traffic mix: one user's requests drawn by weight from the plan's request classes.

``[[request.classes]]`` (kneeswarm.contracts.classes) gives each class its own [request] settings
over the plan's; each class gets a protocol of its own built from them (its model in the path or
the body, an adapter in the protocol's own field, its lengths), and every request draws its
class from a random number generator seeded by the plan's seed and the user's (the same plan
draws the same sequence of classes again, user by user).  The request carries its class
(``PreparedRequest.klass``), which the user hands to the recorder: the row's ``class`` column.
An answer is judged by the protocol of the class that built the request (``of``).
"""

from __future__ import annotations

import bisect
import dataclasses
import itertools
import logging
import random
from typing import Any

from kneeswarm.contracts.classes import RequestClass
from kneeswarm.contracts.plan import EndpointPlan
from kneeswarm.locustfiles.protocols.base import PreparedRequest, Protocol, Tokens

logger = logging.getLogger(__name__)

TAGGED_MAX = 1024  # tagged requests kept per user (pre-built bodies: BODY_VARIANTS per class)


class Mixed(Protocol):
    """The classes' protocols behind one: ``next_request`` draws a class by weight."""

    name = "mix"

    def __init__(self, classes: list[RequestClass], make: Any, seed: int = 0,
                 endpoint: EndpointPlan | None = None) -> None:
        """``make(request_cfg, seed)``: the plan's protocol for one class's [request] settings."""
        self.classes = classes
        self.protocols = {c.name: make(vars(c.request), seed) for c in classes}
        first = self.protocols[classes[0].name]
        self.cfg, self.seed, self.endpoint, self.headers = first.cfg, seed, first.endpoint, first.headers
        self.health_path = first.health_path
        self._secrets = first._secrets
        self._names = [c.name for c in classes]
        self._cumulative = list(itertools.accumulate(c.weight for c in classes))
        self._rng = random.Random(f"mix:{first.cfg.get('seed', 0)}:{seed}")  # per user, reproducible
        # each request a class's protocol handed out, with its class: most cycle through a few pre-built
        # bodies, tagged once (the original is kept in the entry, so its id cannot be reused)
        self._tagged: dict[int, tuple[PreparedRequest, PreparedRequest]] = {}

    def draw(self) -> str:
        """The next request's class, by weight."""
        x = self._rng.random() * self._cumulative[-1]
        return self._names[min(bisect.bisect_right(self._cumulative, x), len(self._names) - 1)]

    def next_request(self) -> PreparedRequest:
        name = self.draw()
        req = self.protocols[name].next_request()
        hit = self._tagged.get(id(req))
        if hit is not None and hit[0] is req:
            return hit[1]
        tagged = dataclasses.replace(req, klass=name)
        if len(self._tagged) < TAGGED_MAX:  # bodies built per request (a dataset) are tagged each time
            self._tagged[id(req)] = (req, tagged)
        return tagged

    def of(self, req: PreparedRequest) -> Protocol:
        return self.protocols.get(req.klass or "", self) if req.klass else self

    def check_response(self, body: bytes) -> Tokens | None:
        return self.protocols[self._names[0]].check_response(body)

    def new_stream(self, t0: float) -> Any:
        return self.protocols[self._names[0]].new_stream(t0)

    def preflight(self, base_url: str, timeout: float = 10.0) -> None:
        """Every class's own preflight: each model (adapter, path) the mix names is served."""
        for p in self.protocols.values():
            p.preflight(base_url, timeout)
