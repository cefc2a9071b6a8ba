"""Files moved through a command channel rather than SFTP: the SSH transport's fallback where a
server has no sftp subsystem, and the only way for the exec transport (kubectl/docker exec,
nsenter), which has nothing but a command's stdin and stdout.

Each operation is one command: ``python3 -c EXEC_FILE_OPS OP PATH [ARGS]`` where the host has the
python agent, ``sh -c EXEC_FILE_OPS_SH sh OP PATH [ARGS]`` where it has only a shell (busybox is
enough: cat, chmod, mv, sha256sum, wc, tail, head).  An upload answers the sha256 of the file as
written, checked against the bytes sent (Ansible's piped transfer).

    data = exec_op(t, "read", path, "0", "4096")
    exec_put(t, path, data, 0o644)       # TransportError on a checksum mismatch
"""

from __future__ import annotations

import hashlib
import json

from kneeswarm.agents.errors import AgentError, TransportError
from kneeswarm.agents.transport import Transport

EXEC_OP_TIMEOUT = 30.0  # seconds for one file operation (a 4 MiB read or the agent's upload)
#: The file operations through the exec channel, for a server without the sftp subsystem. Run as
#: ``python3 -c EXEC_FILE_OPS OP PATH [ARGS]``; exit 3 means "no such file or directory".
EXEC_FILE_OPS = r"""
import hashlib, json, os, sys
op, path = sys.argv[1], sys.argv[2]
try:
    if op == "put":
        tmp = path + ".tmp-upload"
        with open(tmp, "wb") as f:
            f.write(sys.stdin.buffer.read())
        os.chmod(tmp, int(sys.argv[3], 8))
        os.replace(tmp, path)
        with open(path, "rb") as f:
            print(hashlib.sha256(f.read()).hexdigest())
    elif op == "sizes":
        print(json.dumps({e.name: e.stat().st_size for e in os.scandir(path) if e.is_file(follow_symlinks=False)}))
    elif op == "read":
        with open(path, "rb") as f:
            f.seek(int(sys.argv[3]))
            sys.stdout.buffer.write(f.read(int(sys.argv[4])))
    elif op == "mkdir":
        os.makedirs(path, mode=0o700, exist_ok=True)
except FileNotFoundError as e:
    sys.stderr.write(f"{e}\n")
    sys.exit(3)
"""


#: The same operations in POSIX sh, for a host without python3 (the shell agent's hosts):
#: ``sh -c EXEC_FILE_OPS_SH sh OP PATH [ARGS]``; exit 3 means "no such file or directory".
EXEC_FILE_OPS_SH = r"""
op=$1; path=$2
case $op in
put) tmp="$path.tmp-upload"; cat > "$tmp" && chmod "$3" "$tmp" && mv -f "$tmp" "$path" && sha256sum "$path" | cut -d' ' -f1 ;;
sizes) [ -d "$path" ] || { echo "$path: no such directory" >&2; exit 3; }
  cd "$path" || exit 1; printf '{'; s=
  for f in * .[!.]*; do
    [ -f "$f" ] && [ ! -L "$f" ] || continue
    printf '%s"%s": %s' "$s" "$f" "$(wc -c < "$f" | tr -d ' ')"; s=', '
  done
  printf '}\n' ;;
read) [ -f "$path" ] || { echo "$path: no such file" >&2; exit 3; }
  tail -c +"$(($3 + 1))" "$path" | head -c "$4" ;;
mkdir) mkdir -p -m 700 "$path" ;;
*) echo "unknown op $op" >&2; exit 2 ;;
esac
"""


def exec_op(t: Transport, op: str, path: str, *args: str, stdin: bytes | None = None) -> bytes:
    """Run one file operation on ``t``'s host through its command channel; its stdout.
    FileNotFoundError where the path is not there (exit 3); AgentError (one line) otherwise."""
    argv = ["sh", "-c", EXEC_FILE_OPS_SH, "sh"] if t.shell_file_ops else [*t.python, "-c", EXEC_FILE_OPS]
    res = t.run([*argv, op, path, *args], EXEC_OP_TIMEOUT, stdin=stdin)
    if res.rc == 3:
        raise FileNotFoundError(path)
    if res.rc != 0:
        raise AgentError(f"{t.label}: {op} {path} through the exec channel failed: {res.err_line()}")
    return res.stdout


def exec_put(t: Transport, path: str, data: bytes, mode: int) -> None:
    """Write ``data`` to ``path`` (through a temporary name) and check the sha256 the host computed."""
    got = exec_op(t, "put", path, f"{mode:o}", stdin=data).decode("utf-8", "replace").strip()
    if got != hashlib.sha256(data).hexdigest():
        raise TransportError(f"{t.label}: upload of {path} through the exec channel: sha256 mismatch")


def exec_sizes(t: Transport, path: str) -> dict[str, int]:
    """Regular files directly in ``path`` and their sizes; AgentError when the directory is gone."""
    try:
        return {str(k): int(v) for k, v in json.loads(exec_op(t, "sizes", path)).items()}
    except FileNotFoundError:
        raise AgentError(f"{t.label}: agent directory {path} is gone") from None
    except (ValueError, AttributeError):
        raise TransportError(f"{t.label}: listing {path} through the exec channel gave no JSON") from None
