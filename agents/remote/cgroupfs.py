"""Where a process's cgroups are: the cgroup mounts of a mountinfo text, a process's groups from
/proc/PID/cgroup, and the directory of one controller's group (v1 or v2).  Pure path work, read by
the cgroup sampler (limits and throttling) and the process tree (``scope = "cgroup"``)."""

import os
import re


CGROUP_FS_VERSION = {"cgroup": 1, "cgroup2": 2}  # mountinfo file system type -> cgroup version


def _unescape_mount(path):
    """A mountinfo path with its octal escapes (\\040 for a space) decoded."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), path)


def cgroup_mounts(mountinfo):
    """{controller: (mount root, mount point)} of the cgroup v1 mounts in a mountinfo text, with
    "" for the cgroup2 (unified) mount; the first mount of each wins."""
    out = {}  # type: dict[str, tuple[str, str]]
    for line in mountinfo.splitlines():
        left, sep, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if not sep or len(fields) < 5 or len(tail) < 3:
            continue
        root, point = _unescape_mount(fields[3]), _unescape_mount(fields[4])
        version = CGROUP_FS_VERSION.get(tail[0])
        if version == 2:
            out.setdefault("", (root, point))
        elif version == 1:
            for opt in tail[2].split(","):
                if opt not in ("rw", "ro") and "=" not in opt:
                    out.setdefault(opt, (root, point))
    return out


def cgroup_paths(text):
    """{controller: cgroup path} from /proc/PID/cgroup ("" for the v2 line "0::/path")."""
    out = {}  # type: dict[str, str]
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        if parts[0] == "0" and parts[1] == "":
            out.setdefault("", parts[2])
        for c in parts[1].split(","):
            if c and "=" not in c:
                out.setdefault(c, parts[2])
    return out


def group_dir(mounts, paths, key):
    """The directory of the process's group in the hierarchy ``key`` (a v1 controller, or "" for
    the unified v2 one), or None where that hierarchy is not mounted here or names no group of it."""
    if key not in mounts or key not in paths:
        return None
    root, point = mounts[key]
    path = paths[key]
    rel = os.path.relpath(path, root) if (path + "/").startswith(root.rstrip("/") + "/") else "."
    return os.path.normpath(os.path.join(point, rel))


def cgroup_dir(mounts, paths, controller, v2_file):
    """(version, directory) of ``controller`` for the process: its v1 hierarchy where one is
    mounted, else the unified (v2) one where ``v2_file`` exists there; (None, None) otherwise."""
    for key, version in ((controller, 1), ("", 2)):
        d = group_dir(mounts, paths, key)
        if d is None:
            continue
        if version == 1 or os.path.exists(os.path.join(d, v2_file)):
            return version, d
    return None, None
