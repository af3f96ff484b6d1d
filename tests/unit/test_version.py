"""One version: ``mqserver.__version__``, what setup.py packages and what --version prints."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

import mqserver
from mqserver import tap

ROOT = Path(__file__).resolve().parents[2]


def test_version_option_prints_mqserver_version(capsys):
    with pytest.raises(SystemExit) as exit_info:
        tap.Options().parseOptions(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.startswith(f"mqserver {mqserver.__version__} (Twisted ")


def test_setup_py_reads_the_package_version():
    out = subprocess.run(
        [sys.executable, "setup.py", "--version"], cwd=ROOT, check=True,
        capture_output=True, text=True,
    ).stdout
    assert out.strip().splitlines()[-1] == mqserver.__version__


def test_changelog_has_an_entry_for_the_version():
    changelog = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    assert re.search(rf"^## {re.escape(mqserver.__version__)}$", changelog, re.M)
