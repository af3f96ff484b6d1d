"""The ``rabbitmq`` peer: a RabbitMQ node of the bench's own, started directly (not by systemd).

Debian's ``rabbitmq-server`` package; the node gets its own name, its own
epmd (a child on a free loopback port, ``ERL_EPMD_PORT``, stopped after the
node), its own distribution and AMQP ports, and its own directories for
Mnesia, logs, the config and the enabled plugins (none) under the bench's
work directory, so neither a packaged node nor ``/etc/rabbitmq`` is touched.
The script under ``/usr/lib/rabbitmq/bin`` execs the Erlang VM when
``RABBITMQ_ALLOW_INPUT`` is set (``-noinput`` is passed all the same), so
the server's PID is the VM's: its CPU and RSS are the node's, and SIGTERM
to it is RabbitMQ's orderly stop.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from bench.clients.amqp import Connection
from bench.proc import Server, free_port, ready, wait_port

SCRIPT = Path("/usr/lib/rabbitmq/bin/rabbitmq-server")
EPMD = Path("/usr/bin/epmd")
START_TIMEOUT = 120.0  #: a node takes seconds to boot, more on a busy machine


def missing() -> str | None:
    """Why a RabbitMQ node cannot run here, or None."""
    if not SCRIPT.exists() or not EPMD.exists():
        return "rabbitmq-server not installed (make bench-setup)"
    return None


def version() -> str:
    """RabbitMQ's and Erlang/OTP's versions, from the installed files."""
    found = sorted(p.name for p in SCRIPT.parent.parent.glob("lib/rabbitmq_server-*"))
    rabbit = found[-1].replace("rabbitmq_server-", "RabbitMQ ") if found else "not installed"
    otp = sorted(Path("/usr/lib/erlang/releases").glob("*/OTP_VERSION"))
    return f"{rabbit} (Erlang/OTP {otp[-1].read_text().strip()})" if otp and found else rabbit


def distinct_ports(count: int) -> list[int]:
    ports: set[int] = set()
    while len(ports) < count:
        ports.add(free_port())
    return sorted(ports)


def start_rabbitmq(workdir: Path) -> Server:
    """A node on free loopback ports; ``server.ports['main']`` is AMQP."""
    workdir.mkdir(parents=True, exist_ok=True)
    amqp, dist, epmd_port = distinct_ports(3)
    (workdir / "rabbitmq.conf").write_text(f"listeners.tcp.default = 127.0.0.1:{amqp}\n")
    (workdir / "enabled_plugins").write_text("[].\n")
    (workdir / "rabbitmq-env.conf").write_text("")
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(workdir),
        "LANG": "C.UTF-8", "ERL_EPMD_ADDRESS": "127.0.0.1", "ERL_EPMD_PORT": str(epmd_port),
        "RABBITMQ_NODENAME": f"bench{amqp}@localhost", "RABBITMQ_DIST_PORT": str(dist),
        "RABBITMQ_MNESIA_BASE": str(workdir / "mnesia"),
        "RABBITMQ_LOG_BASE": str(workdir / "log"), "RABBITMQ_LOGS": "-",
        "RABBITMQ_CONFIG_FILE": str(workdir / "rabbitmq"),
        "RABBITMQ_ADVANCED_CONFIG_FILE": str(workdir / "advanced.config"),
        "RABBITMQ_ENABLED_PLUGINS_FILE": str(workdir / "enabled_plugins"),
        "RABBITMQ_CONF_ENV_FILE": str(workdir / "rabbitmq-env.conf"),
        "RABBITMQ_ALLOW_INPUT": "true",
        # +sbwt none: an idle node's schedulers otherwise spin for work, and on
        # two cores that spinning is taken from the rounds of other systems
        # run while the node waits for its next one (RabbitMQ's own advice
        # for shared hosts)
        "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS":
            "-noinput -start_epmd false +sbwt none +sbwtdcpu none +sbwtdio none",
    }
    epmd = ready(Server("epmd", [str(EPMD), "-port", str(epmd_port), "-address", "127.0.0.1"],
                        workdir, env), lambda started: wait_port(started, epmd_port))
    try:
        server = Server("rabbitmq", [str(SCRIPT)], workdir, env)
    except BaseException:
        epmd.stop()
        raise
    server.companions.append(epmd)
    ready(server, lambda started: wait_amqp(started, amqp))
    server.ports = {"main": amqp}
    return server


def wait_amqp(server: Server, port: int) -> None:
    """Wait until the node opens an AMQP connection and channel (its boot has finished)."""
    deadline = time.monotonic() + START_TIMEOUT
    wait_port(server, port, START_TIMEOUT)
    while True:
        try:
            Connection(port).sock.close()
            return
        except (OSError, RuntimeError) as e:
            if server.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"rabbitmq did not accept AMQP on {port}: {e}\n"
                                   f"{server.log_text()[-2000:]}") from None
            time.sleep(0.2)
