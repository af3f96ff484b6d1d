"""Sphinx configuration for the mqserver documentation (``make docs``).

The Markdown pages stay plain GitHub Markdown (read through myst-parser);
the reference pages are generated from the code by ``_ext/mqserver_docs.py``.
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "_ext"))

import mqserver  # noqa: E402  (after the path set-up, for the version)

project = "mqserver"
author = "mqserver contributors"
copyright = "mqserver contributors"
release = mqserver.__version__
version = release

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "mqserver_docs",
]
source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "Thumbs.db", ".DS_Store"]

# GitHub-style heading anchors, so `page.md#section` links work on GitHub and here.
myst_heading_anchors = 3
myst_enable_extensions = ["colon_fence"]

autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_default_options = {"members": True, "show-inheritance": True}

html_theme = "alabaster"
html_title = f"mqserver {release}"
