"""contrib/systemd: the example settings parse with today's Options, and the unit uses them."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from mqserver import tap

SYSTEMD = Path(__file__).resolve().parents[2] / "contrib" / "systemd"


def _environment() -> dict[str, str]:
    """The EnvironmentFile as systemd reads it: KEY="value" lines, # comments."""
    values = {}
    for line in (SYSTEMD / "mqserver.env").read_text(encoding="utf-8").splitlines():
        if line.strip() and not line.startswith("#"):
            key, _, value = line.partition("=")
            values[key] = value.strip('"')
    return values


def test_example_options_are_valid_options():
    options = tap.Options()
    options.parseOptions(shlex.split(_environment()["MQSERVER_OPTS"]))
    assert {name for name, _ in options["protocols"]} == {"mqks", "phpmq", "emqp"}
    assert options["storage"] == "sqlite"
    assert all("interface=127.0.0.1" in endpoint for _, endpoint in options["protocols"])


def test_unit_uses_every_setting_and_nothing_undefined():
    unit = (SYSTEMD / "mqserver.service").read_text(encoding="utf-8")
    [exec_start] = re.findall(r"^ExecStart=(.*)$", unit, re.M)
    used = set(re.findall(r"\$\{?(\w+)\}?", exec_start))
    assert used == set(_environment())
    assert "twist " in exec_start and exec_start.split()[0].startswith("/opt/mqserver/bin/")
    assert re.search(r"^EnvironmentFile=/etc/mqserver/mqserver.env$", unit, re.M)
