"""kneeswarm's remote agent: python3 standard library only (pynvml used when present), shipped to
a host as ONE file, the zipapp ``remote.pyz`` that agents/bundle.py packs from this package at
deploy time and the host runs as ``python3 -I -S remote.pyz VERB ...``.

It runs on every python3 from 3.6 up (RHEL 8's and Ubuntu 18.04's default): no syntax or library
call newer than 3.6 -- no ``from __future__ import annotations`` (annotations that name newer types
are strings), no walrus, no dataclasses, no ``capture_output``/``text=`` -- checked by
tests/test_agent_pythons.py under every interpreter the machine has.  It imports nothing of the
project: the controller imports its defaults and file names (``defaults``) instead.

The package, by concept (each module imports only the ones above it in this list):

* ``defaults``: every default and file name, spelled once, shared with the controller;
* ``common`` (timed waits, the clock, the log), ``files`` (the agent directory's files and
  MANIFEST.json: what the controller fetches and checks), ``processes`` (pids by start time,
  process groups signalled only while still ours), ``cgroupfs`` (where a process's cgroups are);
* ``tree``: the monitored service's processes (the process found and its descendants, its
  cgroup's processes, or it alone), listed again at every sample, and their cumulative counters;
* ``samplers`` (the in-process samplers' base; /proc, NVML, fds), ``prometheus`` (the /metrics
  scrape), ``cgroup`` (limits and throttling);
* ``supervisor``: the daemon (``start``, ``stop``): collectors, watchdog, status.json;
* ``watch``: the controller's live channels (``watch``, its heartbeat; ``echo``, the clock);
* ``preflight``: facts about the host and the monitored process;
* ``cli``: the verbs.

Verbs, driven by the controller (agents/host.py):

    remote.pyz preflight [CONFIG.json | '{json}']   facts about the host, as JSON on stdout
    remote.pyz start CONFIG.json                    daemonise, start collectors; JSON on stdout
    remote.pyz watch DIR                            the controller's heartbeat channel (below)
    remote.pyz stop DIR                             stop everything, write MANIFEST.json
    remote.pyz echo                                 line echo with timestamps (clock offset)

The run directory holds the config (agent.json), one raw file per collector exactly as the tool
printed it (stderr in <name>.err), the JSON-lines output of the in-process samplers, agent.pid,
status.json, agent.log and, once stopped, MANIFEST.json (sha256 and size of every file).

What runs is read from agent.json["collectors"]: each entry has ``argv`` (+ ``env``), a command
run in its own session, or ``sampler`` (a name in ``SAMPLERS``) + ``params``, a thread here. The
agent knows no collector by name.

Nothing is left running when the controller goes away:
* ``watch`` is a long-lived process fed one line per heartbeat by the controller; each line renews
  the heartbeat file. When the controller process dies its kernel closes the connection, so
  ``watch`` reads EOF: unless a newer heartbeat arrives within ``WATCH_EOF_GRACE`` seconds (a
  reconnected controller), it tells the agent to stop (SIGUSR1). A network cut gives no EOF (or
  one long after the last line, when sshd gives up on the client): the heartbeat timeout governs.
* the agent's watchdog stops everything when the heartbeat file has not changed for
  ``heartbeat_timeout`` seconds or ``max_duration`` has passed.
Every child is started in its own session and only signalled after checking that its pid still has
the start time recorded for it.

Timed waits use select() rather than time.sleep()/Event.wait(): libfaketime (used in the tests to
shift this host's clock) breaks clock_nanosleep and timed condition waits.
"""

from .cgroup import CgroupSampler, cgroup_dir, cgroup_mounts, cgroup_paths, cpuset_count
from .cli import main
from .defaults import *  # noqa: F401,F403 -- the names the controller reads (file names, timings)
from .prometheus import PrometheusSampler
from .samplers import FdSampler, NvmlSampler, ProcfsSampler, Sampler
from .supervisor import SAMPLERS, Agent
from .tree import Accounts, ServiceTree
