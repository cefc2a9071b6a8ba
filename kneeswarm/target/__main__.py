"""``python -m kneeswarm.target``: run the bundled demo inference server (see server.py)."""

from __future__ import annotations

import sys

from kneeswarm.target.server import main

if __name__ == "__main__":
    sys.exit(main())
