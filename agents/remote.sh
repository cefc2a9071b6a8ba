#!/bin/sh
# kneeswarm shell agent: the stand-in for remote.pyz on a host without python3 (or with one older
# than 3.6): minimal and distroless containers, appliances. POSIX sh and the tools such a host has
# (date, awk, sed, tr, grep, sha256sum; setsid, timeout where present: coreutils or busybox); the
# same verbs, files and JSON answers as remote.pyz, so the controller (agents/deploy.py,
# heartbeat.py, fetch.py, clock.py) drives it unchanged:
#
#   remote.sh preflight CONF    facts about the host, as JSON (the tool checks are CONF's lines)
#   remote.sh start CONF        start the daemon, which starts the collectors CONF names
#   remote.sh watch DIR         the controller's heartbeat channel
#   remote.sh stop DIR          stop everything, write MANIFEST.json
#   remote.sh echo              line echo with timestamps (clock offset)
#
# What it cannot do, and remote.pyz can: the in-process samplers (the /proc sampler, NVML, the
# Prometheus scrape).  The service's processes (the process found and its descendants, or its
# cgroup's) are followed by the pidstat collector's own command (collectors/pidstat.py
# TREE_SCRIPT: pidstat started again on the new pids whenever they change). Collectors run as commands only, each in its own session, signalled only
# while its pid still has the start time recorded for it. The daemon's watchdog stops them when
# the heartbeat file has not changed for HEARTBEAT_TIMEOUT seconds or MAX_DURATION has passed;
# the watch channel's EOF (the controller died) stops them after WATCH_EOF_GRACE seconds.
set -u

WATCH_EOF_GRACE=5       # seconds after the watch channel's EOF before the agent is told to stop
WATCH_EOF_MAX_SILENCE=12  # an EOF this long after the last line is a dead link, not a dead controller
STOP_GRACE=2            # seconds between SIGINT, SIGTERM and SIGKILL of a collector
START_WAIT=15           # seconds `start` waits for the daemon to report ready
STOP_WAIT=20            # seconds `stop` waits for the daemon to exit
CHECK_TIMEOUT=8         # seconds for one tool version check
LOOP_PERIOD=0.5         # watchdog period (GNU and busybox sleep take fractions)
STATUS_EVERY=4          # status.json rewritten every this many watchdog periods

SELF=$(cd "$(dirname "$0")" && pwd)/$(basename "$0")

# Epoch seconds with a fraction. date +%N where date has it (GNU); busybox's prints "%N": there
# the fraction comes from /proc/uptime (centiseconds, read without a fork), on a base taken at the
# instant date's second turns (init_clock, once per process, in the main shell: up to a second).
UPTIME_BASE=""
calibrate_uptime() {
	s0=$(date +%s)
	while s=$(date +%s); [ "$s" = "$s0" ]; do :; done
	read -r up _ < /proc/uptime
	UPTIME_BASE=$((s * 100 - ${up%.*}${up#*.}))
}

init_clock() {
	case "$(date +%N 2>/dev/null)" in *N) [ -r /proc/uptime ] && calibrate_uptime ;; esac
}

now() {
	_t=$(date +%s.%N 2>/dev/null)
	case "$_t" in
	*N)
		if [ -n "$UPTIME_BASE" ]; then
			read -r up _ < /proc/uptime
			_c=$((UPTIME_BASE + ${up%.*}${up#*.}))
			_t=${_c%??}.${_c#"${_c%??}"}
		else
			_t=${_t%%.*}
		fi ;;
	esac
	printf '%s\n' "$_t"
}
now_s() { date +%s; }

# A JSON string literal of $1 (control characters dropped, tabs as spaces).
json_str() {
	printf '%s' "$1" | tr '\011' ' ' | tr -d '\000-\010\013-\037' \
		| sed -e 's/\\/\\\\/g' -e 's/"/\\"/g' \
		| awk 'BEGIN { printf "\"" } { printf "%s%s", s, $0; s = "\\n" } END { printf "\"" }'
}

json_num_or_null() { case "${1:-}" in ''|*[!0-9.]*) printf null ;; *) printf '%s' "$1" ;; esac; }

# Field 22 (start time, clock ticks since boot) of /proc/PID/stat; empty when gone or a zombie.
start_time() {
	[ -r "/proc/$1/stat" ] || return 0
	sed 's/^.*) //' "/proc/$1/stat" 2>/dev/null | awk '$1 != "Z" { print $20 }'
}

is_ours() { [ -n "${1:-}" ] && [ -n "${2:-}" ] && [ "$(start_time "$1")" = "$2" ]; }  # args may be absent: an empty pid file

write_atomic() { cat > "$1.tmp$$" && mv -f "$1.tmp$$" "$1"; }

# -- preflight ---------------------------------------------------------------------------------
TOOLS=""
check() {  # check NAME ARGV...: one tool's version check, as JSON appended to TOOLS
	name=$1; shift
	path=$(command -v "$1" 2>/dev/null || true)
	if [ -z "$path" ]; then
		entry="{\"found\": false, \"error\": $(json_str "$1: not found on PATH")}"
	else
		if command -v timeout >/dev/null 2>&1; then
			out=$(LC_ALL=C timeout "$CHECK_TIMEOUT" "$@" </dev/null 2>&1); rc=$?
		else
			out=$(LC_ALL=C "$@" </dev/null 2>&1); rc=$?
		fi
		out=$(printf '%s' "$out" | head -c 4000)
		entry="{\"found\": true, \"path\": $(json_str "$path"), \"rc\": $rc, \"output\": $(json_str "$out")}"
	fi
	TOOLS="${TOOLS:+$TOOLS, }$(json_str "$name"): $entry"
}

cpu_json() {
	n=$(grep -c '^processor' /proc/cpuinfo 2>/dev/null || true)
	[ -n "$n" ] && [ "$n" -gt 0 ] 2>/dev/null || n=$(getconf _NPROCESSORS_ONLN 2>/dev/null || echo null)
	awk -F: -v n="$n" '
		function trim(s) { sub(/^[ \t]+/, "", s); sub(/[ \t]+$/, "", s); return s }
		{ k = trim($1); v = trim($2) }
		k == "physical id" { phys = v; if (!(v in sockets)) { sockets[v] = 1; ns++ } }
		k == "core id" { c = phys SUBSEP v; if (!(c in cores)) { cores[c] = 1; nc++ } }
		k == "model name" && model == "" { model = v; gsub(/\\/, "\\\\", model); gsub(/"/, "\\\"", model) }
		END {
			printf "{\"logical_cpus\": %s", n
			if (ns) printf ", \"sockets\": %d, \"physical_cores\": %d, \"threads_per_core\": %d", ns, nc, (nc ? int(n / nc) : 1)
			printf ", \"model\": %s, \"source\": \"cpuinfo\"}", (model == "" ? "null" : "\"" model "\"")
		}' /proc/cpuinfo 2>/dev/null || printf '{"logical_cpus": %s}' "$n"
}

gpus_json() {
	if command -v nvidia-smi >/dev/null 2>&1; then
		nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader,nounits 2>/dev/null \
			| awk -F', *' 'BEGIN { printf "[" } NF == 4 && $1 ~ /^[0-9]+$/ {
				gsub(/"/, "", $2); printf "%s{\"index\": %d, \"name\": \"%s\", \"memory_total_mb\": %s, \"driver\": \"%s\"}", s, $1, $2, ($3 ~ /^[0-9]+$/ ? $3 : "null"), $4; s = ", " }
				END { printf "]" }'
	else
		printf '[]'
	fi
}

cmdline() { tr '\000' ' ' < "/proc/$1/cmdline" 2>/dev/null | sed 's/ *$//'; }
ppid_of() { sed 's/^.*) //' "/proc/$1/stat" 2>/dev/null | awk '{ print $2 }'; }

# One process out of several: the one whose parent is not also a candidate.
pick_root() {  # pick_root WHAT PID...
	what=$1; shift
	[ $# -gt 0 ] || { printf '{"error": %s}' "$(json_str "no process $what")"; return; }
	roots=""
	for p in "$@"; do
		pp=$(ppid_of "$p")
		case " $* " in *" $pp "*) ;; *) roots="$roots $p" ;; esac
	done
	set -- $roots
	cands=$(echo $roots | tr ' ' ',')
	if [ $# -eq 1 ]; then
		printf '{"pid": %s, "cmdline": %s, "by": "%s", "candidates": [%s]}' "$1" "$(json_str "$(cmdline "$1")")" "$BY" "$cands"
	else
		printf '{"error": %s, "candidates": [%s]}' "$(json_str "$# unrelated processes $what; give pid = ... to choose one")" "$cands"
	fi
}

process_json() {
	if [ -n "${PID:-}" ]; then
		if [ -d "/proc/$PID" ]; then
			printf '{"pid": %s, "cmdline": %s, "by": "pid"}' "$PID" "$(json_str "$(cmdline "$PID")")"
		else
			printf '{"error": %s}' "$(json_str "no process with pid $PID")"
		fi
	elif [ -n "${PROCESS:-}" ]; then
		me=$$; mine=" $$ "
		while [ -n "$me" ] && [ "$me" != 0 ]; do me=$(ppid_of "$me"); mine="$mine$me "; done
		found=$(for d in /proc/[0-9]*; do  # "pid cmdline" lines (one fork each), one grep over them
			p=${d#/proc/}
			case "$mine" in *" $p "*) continue ;; esac
			printf '%s %s\n' "$p" "$(tr '\000\n' '  ' < "$d/cmdline" 2>/dev/null)"
		done | awk '$2 != "" && !/remote\.(sh|py)/' | while read -r p c; do
			printf '%s\n' "$c" | grep -Eq -- "$PROCESS" 2>/dev/null && echo "$p"
		done)
		BY=process pick_root "matching '$PROCESS'" $found
	elif [ -n "${PORT:-}" ]; then
		hex=$(printf '%04X' "$PORT")
		inodes=$(awk -v h=":$hex" 'NR > 1 && $4 == "0A" && substr($2, length($2) - 4) == h { print $10 }' \
			/proc/net/tcp /proc/net/tcp6 2>/dev/null | sort -u)
		[ -n "$inodes" ] || { printf '{"error": %s}' "$(json_str "nothing listens on TCP port $PORT")"; return; }
		found=$(ls -l /proc/[0-9]*/fd 2>/dev/null | awk -v want=" $(echo $inodes) " '
			/^\/proc\/[0-9]+\/fd:$/ { split($0, a, "/"); pid = a[3] }
			/ -> socket:\[/ { i = $NF; gsub(/[^0-9]/, "", i); if (index(want, " " i " ")) print pid }' | sort -u)
		BY=port pick_root "listening on TCP port $PORT" $found
	else
		printf '{"pid": null, "by": null}'
	fi
}

cmd_preflight() {
	PID=""; PROCESS=""; PORT=""; SCOPE=""
	[ -n "${1:-}" ] && . "$1"
	proc=$(process_json)
	case "$proc" in  # the service the process stands for: its scope (pidstat follows its processes)
		*'"pid": '[0-9]*) [ -n "$SCOPE" ] && proc="{\"scope\": $(json_str "$SCOPE"), ${proc#\{}" ;;
	esac
	mem=$(awk '/^MemTotal:/ { print $2 }' /proc/meminfo 2>/dev/null)
	procfs=false; [ -d /proc/self ] && procfs=true
	printf '{"ok": true, "agent": "shell", "agent_version": 1, "python": null, "samplers": []'
	printf ', "hostname": %s, "kernel": %s, "machine": %s' \
		"$(json_str "$(uname -n)")" "$(json_str "$(uname -r)")" "$(json_str "$(uname -m)")"
	printf ', "time": %s, "tools": {%s}, "cpu": %s, "memory_total_kb": %s' \
		"$(json_num_or_null "$(now)")" "$TOOLS" "$(cpu_json)" "$(json_num_or_null "$mem")"
	printf ', "gpus": %s, "nvml": {"available": false, "error": "no python agent"}, "procfs": %s, "process": %s}\n' \
		"$(gpus_json)" "$procfs" "$proc"
}

# -- the daemon --------------------------------------------------------------------------------
collector() {  # collector NAME RAW_FILE ARGV...: start one command in its own session
	name=$1; raw=$2; shift 2
	if command -v setsid >/dev/null 2>&1; then
		setsid "$@" </dev/null >>"$raw" 2>>"$name.err" &
	else
		"$@" </dev/null >>"$raw" 2>>"$name.err" &
	fi
	pid=$!
	echo "$name $pid $(start_time "$pid") $raw" >> collectors.list
	echo "$(date '+%Y-%m-%dT%H:%M:%S') $name: started pid $pid: $*" >&2
}

collector_json() {  # collector_json NAME PID START RAW
	running=false; rc=null; err=null
	if is_ours "$2" "$3"; then
		running=true
	else
		[ -s "exit_$1.tmp" ] && rc=$(cat "exit_$1.tmp")
		[ "$rc" != 0 ] && [ -s "$1.err" ] && err=$(json_str "$(tail -n 1 "$1.err")")
	fi
	bytes=$(wc -c < "$4" 2>/dev/null | tr -d ' ')
	printf '%s: {"kind": "command", "raw_file": %s, "pid": %s, "start_time": %s, "running": %s, "exit_code": %s, "error": %s, "bytes": %s}' \
		"$(json_str "$1")" "$(json_str "$4")" "$2" "$(json_num_or_null "$3")" "$running" "$rc" "$err" "$(json_num_or_null "${bytes:-0}")"
}

reap() {  # the exit code of each collector that ended (the daemon is their parent: wait works here)
	while read -r n p st raw; do
		[ -f "exit_$n.tmp" ] && continue
		is_ours "$p" "$st" && continue
		wait "$p" 2>/dev/null; echo $? > "exit_$n.tmp"
	done < collectors.list
}

write_status() {  # write_status STATE (after reap, in the daemon)
	{
		printf '{"agent": "shell", "agent_pid": %s, "state": "%s", "reason": %s, "started": %s, "updated": %s, "collectors": {' \
			"$$" "$1" "$(if [ -n "$REASON" ]; then json_str "$REASON"; else printf null; fi)" "$STARTED" "$(now)"
		s=""
		while read -r n p st raw; do printf '%s' "$s"; collector_json "$n" "$p" "$st" "$raw"; s=", "; done < collectors.list
		printf '}}\n'
	} | write_atomic status.json
}

stop_collectors() {
	for sig in INT TERM KILL; do
		left=""
		while read -r n p st raw; do
			if is_ours "$p" "$st"; then kill -s "$sig" -- "-$p" 2>/dev/null || kill -s "$sig" "$p" 2>/dev/null; left=1; fi
		done < collectors.list
		[ -n "$left" ] || break
		i=0
		while [ $i -lt $((STOP_GRACE * 20)) ]; do
			alive=""
			while read -r n p st raw; do is_ours "$p" "$st" && alive=1; done < collectors.list
			[ -n "$alive" ] || break
			sleep 0.05; i=$((i + 1))
		done
	done
}

write_manifest() {  # write_manifest DIR
	(
		cd "$1" || exit 1
		printf '{"written": %s, "files": {' "$(now)"
		s=""
		for f in *; do
			[ -f "$f" ] || continue
			case "$f" in MANIFEST.json|heartbeat|agent.pid|*.tmp*) continue ;; esac
			h=$(sha256sum "$f" | awk '{ print $1 }'); n=$(wc -c < "$f" | tr -d ' ')
			printf '%s%s: {"sha256": "%s", "size": %s}' "$s" "$(json_str "$f")" "$h" "$n"; s=", "
		done
		printf '}}\n'
	) | write_atomic "$1/MANIFEST.json"
}

heartbeat_key() { cat heartbeat 2>/dev/null; }

cmd_daemon() {
	cd "$1" || exit 1
	init_clock
	REASON=""; STARTED=$(now)
	trap 'REASON=${REASON:-signal SIGTERM}' TERM
	trap 'REASON=${REASON:-signal SIGINT}' INT
	trap 'REASON=${REASON:-signal SIGHUP}' HUP
	echo "$$ $(start_time $$)" | write_atomic agent.pid
	now | write_atomic heartbeat
	: > collectors.list
	echo "$(date '+%Y-%m-%dT%H:%M:%S') shell agent pid $$ in $1" >&2
	. ./agent.conf
	sleep 0.3
	reap
	write_status running
	t0=$(now_s); key=$(heartbeat_key); beat_at=$t0; k=0
	while [ -z "$REASON" ]; do
		sleep "$LOOP_PERIOD"
		[ -s stop.request ] && REASON=${REASON:-$(cat stop.request)}
		t=$(now_s); nk=$(heartbeat_key)
		if [ "$nk" != "$key" ]; then key=$nk; beat_at=$t; fi
		if [ $((t - beat_at)) -gt "$HEARTBEAT_TIMEOUT" ]; then
			REASON=${REASON:-"heartbeat lost ($((t - beat_at))s > ${HEARTBEAT_TIMEOUT}s)"}
		elif [ $((t - t0)) -gt "$MAX_DURATION" ]; then
			REASON=${REASON:-"max_duration (${MAX_DURATION}s) reached"}
		fi
		k=$((k + 1))
		[ $((k % STATUS_EVERY)) -eq 0 ] && [ -z "$REASON" ] && { reap; write_status running; }
	done
	echo "$(date '+%Y-%m-%dT%H:%M:%S') stopping: $REASON" >&2
	stop_collectors
	reap
	write_status stopped
	write_manifest .
	rm -f agent.pid
}

agent_pid() { awk '{ print $1 }' "$1/agent.pid" 2>/dev/null; }
agent_alive() { [ -r "$1/agent.pid" ] && is_ours $(cat "$1/agent.pid" 2>/dev/null); }

cmd_start() {
	dir=$(cd "$(dirname "$1")" && pwd)
	if agent_alive "$dir"; then
		printf '{"ok": false, "error": %s}\n' "$(json_str "an agent (pid $(agent_pid "$dir")) is already running in $dir")"
		return 2
	fi
	rm -f "$dir/MANIFEST.json" "$dir/stop.request" "$dir/status.json"
	if command -v setsid >/dev/null 2>&1; then
		setsid sh "$SELF" daemon "$dir" </dev/null >>"$dir/agent.log" 2>&1 &
	else
		sh "$SELF" daemon "$dir" </dev/null >>"$dir/agent.log" 2>&1 &
	fi
	i=0
	while [ ! -s "$dir/status.json" ] && [ $i -lt $((START_WAIT * 10)) ]; do sleep 0.1; i=$((i + 1)); done
	if [ ! -s "$dir/status.json" ]; then
		printf '{"ok": false, "error": %s}\n' "$(json_str "agent did not report ready within ${START_WAIT}s: $(tail -n 1 "$dir/agent.log" 2>/dev/null)")"
		return 1
	fi
	printf '{"ok": true, "status": %s}\n' "$(cat "$dir/status.json")"
}

cmd_stop() {
	dir=$(cd "$1" && pwd)
	killed=""
	if agent_alive "$dir"; then
		pid=$(agent_pid "$dir")
		kill -TERM "$pid" 2>/dev/null
		i=0
		while agent_alive "$dir" && [ $i -lt $((STOP_WAIT * 10)) ]; do sleep 0.1; i=$((i + 1)); done
		if agent_alive "$dir"; then kill -KILL "$pid" 2>/dev/null; killed=$pid; fi
	fi
	if [ -n "$killed" ] && [ -f "$dir/collectors.list" ]; then
		(cd "$dir" && stop_collectors)
		rm -f "$dir/agent.pid"
	fi
	write_manifest "$dir"
	reason=$(sed -nE 's/.*"reason": ("[^"]*"|null).*/\1/p' "$dir/status.json" 2>/dev/null)
	printf '{"ok": true, "reason": %s, "status": %s, "killed": [%s], "manifest": %s}\n' \
		"${reason:-null}" "$(cat "$dir/status.json" 2>/dev/null || echo '{}')" "$killed" "$(cat "$dir/MANIFEST.json")"
}

cmd_watch() {
	dir=$1; last=$(now_s)
	while IFS= read -r line; do
		[ "$line" = bye ] && return 0
		agent_alive "$dir" || return 0
		now | write_atomic "$dir/heartbeat"
		last=$(now_s)
		echo ok
	done
	# EOF: the controller died (or a dead link gave up long after its last line)
	[ $(($(now_s) - last)) -gt "$WATCH_EOF_MAX_SILENCE" ] && return 0
	beat=$(cat "$dir/heartbeat" 2>/dev/null)
	sleep "$WATCH_EOF_GRACE"
	[ "$(cat "$dir/heartbeat" 2>/dev/null)" != "$beat" ] && return 0  # a reconnected controller
	agent_alive "$dir" && echo "controller gone (its watch channel closed)" | write_atomic "$dir/stop.request"
	return 0
}

cmd_echo() {
	init_clock
	case "$(date +%N 2>/dev/null)" in
	*N)  # no %N: the /proc/uptime clock, without a fork per line
		while IFS= read -r line; do
			if [ -n "$UPTIME_BASE" ]; then
				read -r up _ < /proc/uptime
				c=$((UPTIME_BASE + ${up%.*}${up#*.}))
				t=${c%??}.${c#"${c%??}"}
			else
				t=$(date +%s)
			fi
			echo "$t $t"
		done ;;
	*)
		while IFS= read -r line; do
			t=$(date +%s.%N)
			echo "$t $t"
		done ;;
	esac
}

verb=${1:-}
[ $# -gt 0 ] && shift
case "$verb" in
	preflight) cmd_preflight "${1:-}" ;;
	start) [ $# -eq 1 ] && cmd_start "$1" ;;
	daemon) cmd_daemon "$1" ;;
	stop) [ $# -eq 1 ] && cmd_stop "$1" ;;
	watch) [ $# -eq 1 ] && cmd_watch "$1" ;;
	echo) cmd_echo ;;
	*) echo "usage: remote.sh {preflight [CONF]|start CONF|watch DIR|stop DIR|echo}" >&2; exit 2 ;;
esac
