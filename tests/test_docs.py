"""The Sphinx site builds with warnings as errors, as ``make docs`` builds it.

A renamed module, a broken cross-reference or a bad docstring would
otherwise only show when someone next builds the docs by hand.
"""

from __future__ import annotations

import html as html_module
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytest.importorskip("sphinx", reason="the docs extra is not installed (pip install -e '.[docs]')")
pytest.importorskip("myst_parser", reason="the docs extra is not installed")


@pytest.fixture(scope="module")
def html(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("docs") / "html"
    result = subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html",
         "-d", str(out.parent / "doctrees"), str(ROOT / "docs"), str(out)],
        capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return out


def text_of(page: Path) -> str:
    """The page's text: literals are split into one <span> per word in the HTML."""
    return html_module.unescape(re.sub(r"<[^>]+>", "", page.read_text(encoding="utf-8")))


def test_every_page_is_built(html):
    pages = {p.relative_to(html).as_posix() for p in html.rglob("*.html")}
    assert {"index.html", "quickstart.html", "deployment.html", "http-reference.html",
            "api.html", "storage.html", "plugins.html", "performance.html",
            "operations.html", "analytics.html", "protocols/mqks.html", "protocols/phpmq.html", "protocols/emqp.html"} <= pages


def test_options_page_has_every_option(html):
    from mqserver.tap import Options

    page = text_of(html / "deployment.html")
    for row in [*Options.optParameters, *Options.optFlags]:
        assert f"--{row[0]}" in page, row[0]
    assert "--protocol" in page and "--version" in page


def test_http_reference_has_every_route(html):
    from mqserver.web.app import all_routes
    from mqserver.web.openapi import spec

    page = text_of(html / "http-reference.html")
    paths = spec(all_routes())["paths"]
    assert len(paths) > 10
    for path, methods in paths.items():
        for method in methods:
            assert f"{method.upper()} {path}" in page


def test_api_reference_documents_the_client(html):
    page = text_of(html / "api.html")
    assert "mqserver.client.HTTPClient" in page
    assert "mqserver.interfaces" in page and "mqserver.testing" in page
