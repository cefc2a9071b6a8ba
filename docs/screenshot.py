"""The README's picture: a real demo run's report/index.html, photographed by headless Chromium.

    .venv/bin/python docs/screenshot.py                 # runs `kneeswarm demo` (~2 min), then shoots
    .venv/bin/python docs/screenshot.py RUN_DIR         # shoots an existing run's report
    .venv/bin/python docs/screenshot.py --out /tmp/report.png RUN_DIR

Debian's chromium (what `make test` installs) driven by Playwright through its executable path:
no browser download.  The page is opened from the run directory's file (the report works offline),
the charts are given time to draw, and the page from its top to the end of its first chart (the
verdict, the findings, the model, the capacity plan, and QPS and P99 against users) is written as
a PNG.  A bad argument is one line on stderr, exit 2.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: the width a reader's browser window usually has; the report's layout is fluid
WIDTH = 1280
#: the window's height while the page lays out (the picture itself runs to the first chart's end)
VIEWPORT_HEIGHT = 1000
#: the report's charts are plotly figures drawn on load; this bounds the wait for the first one
CHART_TIMEOUT_MS = 30_000


def demo_run(out: Path) -> Path:
    """A fresh `kneeswarm demo` run under ``out``: its run directory."""
    kneeswarm = Path(sys.executable).parent / "kneeswarm"
    subprocess.run([str(kneeswarm), "demo", "--out", str(out)], check=True, timeout=900)
    runs = sorted(p for p in out.iterdir() if (p / "report" / "index.html").is_file())
    if not runs:
        raise SystemExit("docs/screenshot.py: the demo wrote no report")
    return runs[-1]


def shoot(report: Path, png: Path) -> None:
    """``report`` at WIDTH from its top to its first chart's end, as ``png``."""
    from playwright.sync_api import sync_playwright

    chromium = shutil.which("chromium")
    if chromium is None:
        raise SystemExit("docs/screenshot.py: Debian's chromium is not installed (apt-get install chromium)")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": WIDTH, "height": VIEWPORT_HEIGHT})
            page.goto(report.resolve().as_uri())
            page.wait_for_selector(".plotly .main-svg", timeout=CHART_TIMEOUT_MS)
            page.wait_for_timeout(500)  # plotly's transitions end within its default 500 ms
            bottom = page.evaluate("document.querySelector('.plotly-graph-div')"
                                   ".getBoundingClientRect().bottom + window.scrollY")
            page.screenshot(path=str(png), full_page=True,
                            clip={"x": 0, "y": 0, "width": WIDTH, "height": int(bottom)})
        finally:
            browser.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_dir", nargs="?", type=Path, help="a run directory (default: run `kneeswarm demo`)")
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "report.png", help="the PNG written")
    args = ap.parse_args(argv)
    if args.run_dir is not None:
        report = args.run_dir / "report" / "index.html"
        if not report.is_file():
            print(f"docs/screenshot.py: {args.run_dir} has no report/index.html", file=sys.stderr)
            return 2
        shoot(report, args.out)
    else:
        with tempfile.TemporaryDirectory(prefix="kneeswarm-screenshot-") as tmp:
            shoot(demo_run(Path(tmp)) / "report" / "index.html", args.out)
    print(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
