"""Sphinx's settings for kneeswarm's docs site (`make docs`; docs/development.md says why Sphinx).

The pages are Markdown (MyST-Parser); README.md is the front page (index.md includes it).  `make
docs` runs sphinx-build with -W --keep-going, so every warning below fails the build: a link to a
page or heading that does not exist (MyST's xref_missing), a page in no toctree.
"""

from __future__ import annotations

project = "kneeswarm"
author = "the kneeswarm developers"
copyright = "the kneeswarm developers"

extensions = ["myst_parser"]
source_suffix = {".md": "markdown"}
root_doc = "index"
# screenshot.py and conf.py are scripts, not pages; the build's own output never lands here
exclude_patterns = ["_build", "screenshot.py"]

# every cross-reference must resolve (Sphinx's own roles); MyST links are checked regardless
nitpicky = True
# "page.md#a-heading" links resolve against the headings of levels 1 to 4, GitHub's slugs
myst_heading_anchors = 4
# a fenced block without a language (commands, the run directory's tree) is shown as text, not
# coloured as Python
highlight_language = "text"

html_theme = "furo"
html_title = "kneeswarm"
html_show_sourcelink = False
