"""``python -m build``, then the wheel installed into a fresh venv, the way users install it.

The editable install the suite otherwise runs against can hide packaging
mistakes (a package missing from setup.py, a plugin module not shipped, a
stale ``dropin.cache``).  Here the venv is built once per session by
``contrib/systemd/install.sh`` (so the service setup, dropin.cache
regeneration included, is exercised too) and each test looks at it.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BUILT_IN_PROTOCOLS = {"mqks", "phpmq", "emqp"}
BUILT_IN_STORAGE = {"sqlite", "log", "memory", "postgres"}
IGNORE = shutil.ignore_patterns(
    ".venv*", ".git", "build", "dist", "*.egg-info", ".tox", "__pycache__", ".hypothesis",
    ".pytest_cache", "dropin.cache", "_build", "data", "artifacts",
)


def _clean_env() -> dict[str, str]:
    """No PYTHONPATH or venv leaking in: only the installed wheel may be found."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return env


@pytest.fixture(scope="session")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """sdist and wheel from a copy of the tree (the wheel is built from the sdist)."""
    base = tmp_path_factory.mktemp("build")
    source = base / "src"
    shutil.copytree(ROOT, source, ignore=IGNORE)
    subprocess.run(
        [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(base / "dist"),
         str(source)],
        check=True, capture_output=True, env=_clean_env(),
    )
    return base / "dist"


@pytest.fixture(scope="session")
def installed(dist: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv with the wheel, set up by contrib/systemd/install.sh (no system changes)."""
    prefix = tmp_path_factory.mktemp("venv") / "mqserver"
    [wheel] = dist.glob("mqserver-*.whl")
    env = {**_clean_env(), "PREFIX": str(prefix), "SKIP_SYSTEM": "1", "PYTHON": sys.executable}
    result = subprocess.run(
        ["bash", str(ROOT / "contrib" / "systemd" / "install.sh"), str(wheel)],
        env=env, capture_output=True, text=True, timeout=600,
    )
    if result.returncode != 0:
        pytest.fail("install.sh failed:\n" + result.stdout + result.stderr)
    return prefix


def _run(prefix: Path, *args: str) -> str:
    return subprocess.run(
        [str(prefix / "bin" / args[0]), *args[1:]], check=True, capture_output=True,
        text=True, env=_clean_env(), cwd=prefix, timeout=120,
    ).stdout


def test_build_makes_a_wheel_and_an_sdist(dist):
    import mqserver

    names = sorted(p.name for p in dist.iterdir())
    assert names == [f"mqserver-{mqserver.__version__}-py3-none-any.whl",
                     f"mqserver-{mqserver.__version__}.tar.gz"]


def test_twistd_lists_mqserver_and_every_plugin_is_found(installed):
    assert re.search(r"^\s+mqserver\s", _run(installed, "twistd", "--help"), re.M)
    found = _run(installed, "python", "-c", (
        "from twisted.plugin import getPlugins\n"
        "from mqserver.interfaces import IProtocolPlugin, IStoragePlugin\n"
        "print(' '.join(sorted(p.name for p in getPlugins(IProtocolPlugin))))\n"
        "print(' '.join(sorted(p.name for p in getPlugins(IStoragePlugin))))\n"
    )).splitlines()
    assert set(found[0].split()) >= BUILT_IN_PROTOCOLS
    assert set(found[1].split()) >= BUILT_IN_STORAGE
    version = _run(installed, "twistd", "mqserver", "--version")
    import mqserver

    assert version.startswith(f"mqserver {mqserver.__version__} ")


def test_install_sh_regenerated_the_plugin_cache(installed):
    [plugins] = installed.glob("lib/python*/site-packages/twisted/plugins")
    # the cache is a pickle keyed by plugin module: ours must be in it, or the
    # service user (who cannot write here) would rescan on every start
    assert b"mqserver_plugin" in (plugins / "dropin.cache").read_bytes()


@pytest.fixture
def installed_server(installed: Path, tmp_path: Path) -> Iterator[tuple[subprocess.Popen, int]]:
    process = subprocess.Popen(
        [str(installed / "bin" / "twistd"), "-n", "--pidfile=", "mqserver",
         "--protocol=mqks:tcp:0:interface=127.0.0.1", "--storage=memory", "--no-http"],
        cwd=tmp_path, env=_clean_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True,
    )
    assert process.stdout is not None
    log = []
    deadline = time.monotonic() + 60
    port = None
    while port is None:
        line = process.stdout.readline()
        log.append(line)
        match = re.search(r"mqks listening on [\d.]+:(\d+)", line)
        if match:
            port = int(match.group(1))
        elif not line or time.monotonic() > deadline:
            process.kill()
            pytest.fail("installed twistd did not start:\n" + "".join(log))
    yield process, port
    process.terminate()
    process.wait(15)


def test_installed_twistd_answers_an_mqks_ping(installed_server):
    _, port = installed_server
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(b"p ping x\n")
        answer = b""
        while not answer.endswith(b"\n"):
            chunk = sock.recv(1024)
            assert chunk, f"closed after {answer!r}"
            answer += chunk
    assert answer == b"p ok x\n"
