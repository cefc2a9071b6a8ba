"""``python3 -I -S remote.pyz VERB ...`` (the zipapp's entry, agents/bundle.py) or ``python -m kneeswarm.agents.remote``."""

import importlib
import sys

if __name__ == "__main__":
    # the package is ``remote`` at the zipapp's root (this file is copied there), ``kneeswarm.agents.remote`` under -m
    cli = importlib.import_module((__package__ or "remote") + ".cli")
    sys.exit(cli.main(sys.argv[1:]))
