"""The agent's verbs (``python3 -I -S remote.pyz VERB ...``)."""

import sys

from .defaults import SCRIPT_FILE
from .preflight import cmd_preflight
from .supervisor import cmd_start, cmd_stop
from .watch import cmd_echo, cmd_watch


def main(argv: "list[str]") -> int:
    usage = "usage: " + SCRIPT_FILE + " {preflight [CONFIG]|start CONFIG|watch DIR|stop DIR|echo}"
    if not argv:
        print(usage, file=sys.stderr)
        return 2
    verb, args = argv[0], argv[1:]
    try:
        if verb == "preflight":
            return cmd_preflight(args[0] if args else None)
        if verb == "echo":
            return cmd_echo()
        verbs = {"start": cmd_start, "watch": cmd_watch, "stop": cmd_stop}
        if verb in verbs and len(args) == 1:
            return verbs[verb](args[0])
    except KeyboardInterrupt:
        return 130
    print(usage, file=sys.stderr)
    return 2
