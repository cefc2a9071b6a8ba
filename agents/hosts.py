"""The agents of every monitored host of a run, driven concurrently (one thread per host), each
host's failure its own.

    with HostAgents.open(plan, run, accept_new_host_keys=False) as agents:
        run.update_meta(hosts_preflight=agents.preflight_all())
        agents.start_all()
        ... load ...; agents.fetch_all() now and then
        agents.finish_all()         # stop, verified fetch, parsed CSVs
        run.update_meta(hosts=agents.meta())
"""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Iterable, TypeVar

from kneeswarm.contracts.plan import HostPlan, Plan
from kneeswarm.contracts.rundir import RunDir

from kneeswarm.agents.errors import AgentError
from kneeswarm.agents.host import HostAgent, open_agent
from kneeswarm.agents.settings import AgentSettings

logger = logging.getLogger(__name__)

MAX_PARALLEL_HOSTS = 32  # hosts driven at once

R = TypeVar("R")


def each(items: list[Any], fn: Callable[[Any], R]) -> list[R | BaseException]:
    """fn(item) for every item at once (a thread each, bounded); results or exceptions, in order."""
    if not items:
        return []

    def guarded(item: Any) -> R | BaseException:
        try:
            return fn(item)
        except Exception as e:  # returned, so that one host's failure stays its own
            return e

    with ThreadPoolExecutor(max_workers=min(len(items), MAX_PARALLEL_HOSTS), thread_name_prefix="hosts") as pool:
        return list(pool.map(guarded, items))


class HostAgents:
    def __init__(self, agents: list[HostAgent]):
        self.agents = agents
        self.finished = False  # finish_all ran: never again (its retries are long)

    @classmethod
    def open(cls, plan: Plan, run: RunDir, accept_new_host_keys: bool = False,
             hosts: Iterable[HostPlan] | None = None) -> HostAgents:
        """Connect to every host of ``plan`` (or ``hosts``) at once; AgentError naming each that failed."""
        settings = AgentSettings.from_plan(plan, accept_new_host_keys)
        wanted = list(plan.hosts if hosts is None else hosts)
        if any(h.kubernetes and "selector" in h.kubernetes for h in wanted):
            from kneeswarm.agents.kubernetes import expand_hosts

            wanted = expand_hosts(wanted)  # one host per pod a selector matches
        results = each(wanted, lambda h: open_agent(h, run, settings))
        opened = [r for r in results if isinstance(r, HostAgent)]
        errors = [r for r in results if not isinstance(r, HostAgent)]
        if errors:
            for a in opened:
                a.close()
            if len(errors) == 1:
                raise errors[0]
            raise AgentError("; ".join(str(e) for e in errors))
        return cls(opened)

    def __iter__(self):
        return iter(self.agents)

    def __getitem__(self, label: str) -> HostAgent:
        for a in self.agents:
            if a.label == label:
                return a
        raise KeyError(label)

    def _all(self, fn: Callable[[HostAgent], R]) -> tuple[dict[str, R], list[str]]:
        """fn on every agent at once: ({label: result}, [one line per AgentError]); any other
        exception is re-raised after all have finished."""
        out, errors = {}, []
        for a, r in zip(self.agents, each(self.agents, fn)):
            if isinstance(r, AgentError):
                errors.append(str(r))
            elif isinstance(r, BaseException):
                raise r
            else:
                out[a.label] = r
        return out, errors

    def preflight_all(self) -> dict[str, Any]:
        """Facts per host; AgentError listing every host that cannot be monitored."""
        facts, errors = self._all(lambda a: a.preflight())
        if errors:
            raise AgentError("; ".join(errors))
        return facts

    def start_all(self) -> None:
        """Start every agent; if one fails, the ones started are stopped and AgentError is raised."""
        _, errors = self._all(lambda a: a.start())
        if errors:
            self.stop_all()
            raise AgentError("; ".join(errors))

    def fetch_all(self) -> dict[str, dict[str, int]]:
        """An incremental fetch of every host; a host that fails is warned about and left for the next."""
        def one(a: HostAgent) -> dict[str, int]:
            try:
                return a.fetch()
            except AgentError as e:
                logger.warning("%s", e)
                a.warnings.add(f"incremental fetch failed: {a.bare(e)}")
                return {}

        return self._all(one)[0]

    def stop_all(self) -> dict[str, Any]:
        out: dict[str, Any]
        out, errors = self._all(lambda a: a.stop())
        for e in errors:
            logger.error("%s", e)
        if errors:
            out["errors"] = errors
        return out

    def _finish(self, a: HostAgent) -> None:
        """Stop, final fetch and parse one host; a failure is its own warning, never the others'."""
        try:
            a.stop()
        except AgentError as e:
            a.warnings.add(f"stop failed: {a.bare(e)}")
            logger.error("%s", e)
        try:
            a.fetch(final=True)
        except AgentError as e:
            a.warnings.add(f"final fetch failed: {a.bare(e)}")
            logger.error("%s", e)
        try:
            a.write_parsed()
        except Exception as e:  # a parse failure must not cost the other hosts
            a.warnings.add(f"parse failed: {e}")
            logger.error("%s: parse failed: %s", a.label, e)

    def finish_all(self) -> dict[str, Any]:
        """Stop, fetch (verified) and parse every host at once. Never raises for one host's failure:
        it is logged and kept in that host's warnings (and ``lost``)."""
        if not self.finished:
            self.finished = True
            self._all(self._finish)
        return self.meta()

    def meta(self) -> dict[str, Any]:
        return {a.label: a.meta() for a in self.agents}

    def close_all(self) -> None:
        each(self.agents, lambda a: a.close())

    def __enter__(self) -> HostAgents:
        return self

    def __exit__(self, *exc: Any) -> None:
        if not self.finished and any(a.started and not a.stopped for a in self.agents):
            try:
                self.finish_all()
            except Exception as e:
                logger.error("stopping agents: %s", e)
        self.close_all()
