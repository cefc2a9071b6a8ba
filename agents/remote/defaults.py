"""The agent's defaults and the names of the files in its directory, spelled once.

Imported by every module of the agent and by the controller side (agents/settings.py,
agents/fetch.py, agents/heartbeat.py, agents/shellagent.py, kneeswarm/contracts/plan.py): what the agent
falls back to and what the controller asks for are the same numbers.  Standard library only,
python 3.6 (it is packed into the agent's zipapp).
"""

import signal as _signal  # (private: ``from .defaults import *`` gives the constants only)

#: The plan's defaults the agent also falls back to when agent.json lacks them.
INTERVAL = 1.0  # seconds between samples ([monitor] interval)
HEARTBEAT_TIMEOUT = 30.0  # the agent stops everything when the controller is silent this long
MAX_DURATION = 3600.0  # seconds the agent runs at most when agent.json says nothing
#: Which processes are the monitored service (tree.py): the process found and its descendants,
#: every process of its cgroup, or the process alone ([monitor] scope, [[hosts]] scope).
SCOPE_TREE, SCOPE_CGROUP, SCOPE_PROCESS = SCOPES = ("tree", "cgroup", "process")
DEFAULT_SCOPE = SCOPE_TREE


AGENT_VERSION = 2
# The agent directory: every file name is typed here once (agents/host.py imports them).
SCRIPT_FILE = "remote.pyz"  # the package, packed by agents/bundle.py
CONFIG_FILE = "agent.json"
PREFLIGHT_FILE = "preflight.json"
PID_FILE = "agent.pid"
STATUS_FILE = "status.json"
MANIFEST_FILE = "MANIFEST.json"
HEARTBEAT_FILE = "heartbeat"
LOG_FILE = "agent.log"
NOT_IN_MANIFEST = (MANIFEST_FILE, HEARTBEAT_FILE, PID_FILE)
#: Files the controller does not copy home.
NOT_FETCHED = frozenset({SCRIPT_FILE, HEARTBEAT_FILE, PID_FILE})
#: Files rewritten in place (not append-only): fetched whole whenever they change.
REWRITTEN = frozenset({STATUS_FILE, MANIFEST_FILE, CONFIG_FILE, PREFLIGHT_FILE})
WATCH_BYE = b"bye"  # the controller's last line on the watch channel: a clean goodbye, not a death
START_WAIT = 15.0  # seconds `start` waits for the daemon to report ready
START_SETTLE = 0.3  # seconds after starting commands before checking none died at once
LOOP_PERIOD = 0.25  # watchdog period
STATUS_PERIOD = 2.0  # status.json rewrite period
STOP_GRACE = 2.0  # seconds between SIGINT, SIGTERM and SIGKILL of a collector
STOP_WAIT = 20.0  # seconds `stop` waits for the agent to exit before killing it
CHECK_TIMEOUT = 8.0  # seconds for one tool version check in preflight
ECHO_IDLE_TIMEOUT = 300.0  # the echo process exits after this long without a line
WATCH_EOF_GRACE = 5.0  # seconds after the watch channel's EOF before the agent is told to stop
WATCH_EOF_MAX_SILENCE = 12.0  # an EOF this long after the last line is a dead link, not a dead controller
WATCH_POLL = 1.0  # seconds between the watch process's checks that the agent still runs
MAX_DURATION_CAP = 7 * 24 * 3600.0
MAX_TASKS = 4096  # threads of the monitored process read per procfs sample
MAX_TREE_PROCESSES = 1024  # processes of the monitored service read per sample (tree or cgroup scope)
MAX_FDS_SCANNED = 4096  # descriptors of a process joining the service looked at for its listening socket
PROMETHEUS_MAX_BYTES = 8 << 20  # a bigger /metrics answer is a failed scrape (both scrapers)
READ_CHUNK = 65536  # bytes per read() of a small file
STOP_SIGNALS = (_signal.SIGINT, _signal.SIGTERM, _signal.SIGKILL)  # pidstat prints its last lines on SIGINT
