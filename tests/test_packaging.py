"""The wheel carries the twistd plugin and no ``twisted/plugins/__init__.py``."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_wheel_contents(tmp_path):
    source = tmp_path / "src"
    shutil.copytree(
        ROOT, source,
        ignore=shutil.ignore_patterns(".venv", ".git", "build", "dist", "*.egg-info", ".tox",
                                      "__pycache__", ".hypothesis", ".pytest_cache", "dropin.cache"),
    )
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", str(tmp_path / "dist"), str(source)],
        check=True, capture_output=True,
    )
    [wheel] = (tmp_path / "dist").glob("mqserver-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert "twisted/plugins/mqserver_plugin.py" in names
    assert "twisted/plugins/__init__.py" not in names
    assert "twisted/__init__.py" not in names
    assert "mqserver/protocols/mqks/protocol.py" in names
    assert "mqserver/protocols/phpmq/protocol.py" in names
    assert "mqserver/protocols/emqp/service.py" in names
    assert "mqserver/zmtp/router.py" in names
    assert "mqserver/storage/schema/sqlite-v1.sql" in names
    assert "mqserver/storage/schema/sqlite-v1-to-v2.sql" in names
    assert "mqserver/storage/schema/sqlite-v2-to-v3.sql" in names
    assert "mqserver/storage/schema/postgres-v1.sql" in names
    assert not any(name.startswith("tests/") for name in names)
