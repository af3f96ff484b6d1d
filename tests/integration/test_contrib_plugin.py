"""The example third-party backend in contrib/, installed the way a user would install it.

It is built and installed (``pip install --no-deps --no-build-isolation
--target``) into a temporary directory that only these tests put on
PYTHONPATH, so the venv stays as ``make`` made it.  Then its own test suite
runs (mqserver's storage contract), and ``twistd mqserver --storage=jsonsnap``
must find it and keep a message across a restart.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "contrib" / "mqserver-example-store"
TWISTD = os.path.join(os.path.dirname(sys.executable), "twistd")


@pytest.fixture(scope="module")
def example(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(copy of the source, directory it is installed in)."""
    base = tmp_path_factory.mktemp("example-store")
    source, site = base / "src", base / "site"
    shutil.copytree(EXAMPLE, source, ignore=shutil.ignore_patterns(
        "build", "*.egg-info", "__pycache__", ".pytest_cache", "dropin.cache"))
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
         "--target", str(site), str(source)],
        check=True, capture_output=True, timeout=300,
    )
    assert (site / "twisted" / "plugins" / "mqserver_example_store_plugin.py").is_file()
    assert not (site / "twisted" / "plugins" / "__init__.py").exists()
    return source, site


def with_path(site: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (
        str(site), os.environ.get("PYTHONPATH"))))}


def test_its_own_suite_runs_the_storage_contract(example: tuple[Path, Path]) -> None:
    source, site = example
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"],
        cwd=source, env=with_path(site), capture_output=True, text=True, timeout=300,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert " passed" in out.stdout and "failed" not in out.stdout


def test_twistd_lists_it(example: tuple[Path, Path], tmp_path: Path) -> None:
    out = subprocess.run([TWISTD, "mqserver", "--help"], env=with_path(example[1]),
                         cwd=tmp_path, capture_output=True, text=True, timeout=60)
    text = " ".join(out.stdout.split())  # --help wraps lines
    assert "jsonsnap (example third-party backend" in text
    assert "--jsonsnap-file" in text


def exchange(port: int, request: bytes, replies: int) -> list[bytes]:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(request)
        data = b""
        while data.count(b"\n") < replies:
            chunk = sock.recv(4096)
            assert chunk, data
            data += chunk
    return data.split(b"\n")[:replies]


def test_a_message_survives_a_restart(example: tuple[Path, Path], start_server,
                                      monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PYTHONPATH", with_path(example[1])["PYTHONPATH"])
    args = ("--protocol=mqks:tcp:0:interface=127.0.0.1", "--storage=jsonsnap")
    first = start_server(*args)
    assert exchange(first.ports["mqks"], b"r rebind --confirm q ev\n"
                    b"m1 publish --confirm ev kept across restarts\n", 2) == [b"r ok ", b"m1 ok "]
    first.stop()
    assert (tmp_path / "data" / "jsonsnap.json").is_file()
    second = start_server(*args)
    assert exchange(second.ports["mqks"], b"c consume --confirm q\n", 2) == [
        b"c ok ", b"c ok m1 event=ev kept across restarts",
    ]
