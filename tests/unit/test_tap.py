"""Options and makeService, on a memory reactor."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from twisted.internet.testing import MemoryReactorClock
from twisted.python import usage

from mqserver import tap


def parse(*args: str) -> tap.Options:
    options = tap.Options()
    options.parseOptions(list(args))
    return options


def test_defaults_listen_with_every_protocol_on_loopback():
    options = parse()
    assert ("mqks", "tcp:25000:interface=127.0.0.1") in options["protocols"]
    assert all("interface=127.0.0.1" in endpoint for _, endpoint in options["protocols"])
    assert options["storage"] == "sqlite"
    assert options["data-dir"] == "data"


def test_protocol_with_and_without_endpoint():
    options = parse("--protocol", "mqks:tcp:0:interface=127.0.0.1", "--protocol=mqks")
    assert options["protocols"] == [
        ("mqks", "tcp:0:interface=127.0.0.1"),
        ("mqks", "tcp:25000:interface=127.0.0.1"),
    ]


def test_unknown_names_list_the_available_ones():
    with pytest.raises(usage.UsageError, match=r"unknown protocol 'nope'; available: .*mqks"):
        parse("--protocol", "nope")
    with pytest.raises(usage.UsageError, match=r"unknown storage 'nope'; available: .*memory"):
        parse("--storage", "nope")


def test_help_documents_plugin_options():
    text = str(tap.Options())
    for flag in ("--protocol", "--storage", "--mqks-max-line", "--ttl-interval"):
        assert flag in text


def test_make_service_opens_storage_then_listens():
    reactor = MemoryReactorClock()
    options = parse(
        "--protocol", "mqks:tcp:4321:interface=127.0.0.1", "--no-gc-tuning", "--storage=memory",
        "--no-http",
    )
    service = tap.makeService(options, reactor=reactor)
    service.startService()
    assert service.ready.called
    [(port, factory, _backlog, interface)] = reactor.tcpServers
    assert (port, interface) == (4321, "127.0.0.1")
    assert factory.wrappedFactory.broker is service.broker  # behind the connection limits
    reactor.advance(5)  # the TTL sweep runs on the injected clock
    d = service.stopService()
    assert d.called


def test_every_mqks_listener_is_in_config_workers_of_each():
    """MQKS ``_eval``'s ``config['workers']``: the addresses the listeners got."""
    options = parse("--protocol=mqks:tcp:4321:interface=127.0.0.1",
                    "--protocol=mqks:tcp:4322:interface=127.0.0.1", "--storage=memory",
                    "--no-http", "--no-gc-tuning")
    reactor = MemoryReactorClock()
    service = tap.makeService(options, reactor=reactor)
    service.startService()
    first, second = [factory.wrappedFactory for _, factory, _, _ in reactor.tcpServers]
    assert first.workers is second.workers  # one list per server
    # (a memory reactor's ports say 0.0.0.0 whatever they were given)
    assert first.workers == ["0.0.0.0:4321:4321", "0.0.0.0:4322:4322"]
    assert service.stopService().called


def test_extra_listeners_start_once_per_protocol_with_their_labels():
    options = parse(
        "--protocol=emqp:tcp:4000:interface=127.0.0.1", "--protocol=mqks:tcp:4321",
        "--emqp-backend=tcp:4001:interface=127.0.0.1", "--emqp-admin=tcp:4002:interface=127.0.0.1",
        "--storage=memory",
    )
    reactor = MemoryReactorClock()
    service = tap.makeService(options, reactor=reactor)
    assert [listener.protocol for listener in service][:4] == [
        "emqp", "emqp-backend", "emqp-admin", "mqks",
    ]
    service.startService()
    assert {4000, 4001, 4002, 4321} <= {port for port, *_ in reactor.tcpServers}
    assert all(interface == "127.0.0.1" for port, _, _, interface in reactor.tcpServers
               if port != 4321)
    assert service.stopService().called


def test_http_listens_on_loopback_by_default_and_no_http_turns_it_off(tmp_path):
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    options = parse("--protocol", "mqks:tcp:4321:interface=127.0.0.1", "--storage=memory",
                    f"--http-token-file={token}", "--http-max-body=1000",
                    "--http-read-token=reader", "--http-max-batch=50")
    reactor = MemoryReactorClock()
    service = tap.makeService(options, reactor=reactor)
    service.startService()
    http = [(port, factory.wrappedFactory) for port, factory, _, interface in reactor.tcpServers
            if (port, interface) == (8080, "127.0.0.1")]
    assert [type(factory).__name__ for _, factory in http] == ["APISite"]
    api = http[0][1].api
    assert (api.token, api.read_token, http[0][1].max_body) == ("s3cret", "reader", 1000)
    assert api.max_batch == 50
    assert service.stopService().called
    options = parse("--protocol", "mqks:tcp:4321:interface=127.0.0.1", "--storage=memory",
                    "--no-http")
    reactor = MemoryReactorClock()
    tap.makeService(options, reactor=reactor).startService()
    assert [port for port, *_ in reactor.tcpServers] == [4321]


def test_metrics_listener_serves_health_and_metrics_and_nothing_else():
    from treq.testing import StubTreq

    options = parse("--protocol", "mqks:tcp:4321:interface=127.0.0.1", "--storage=memory",
                    "--no-http", "--metrics=tcp:9100:interface=0.0.0.0")
    reactor = MemoryReactorClock()
    service = tap.makeService(options, reactor=reactor)
    service.startService()
    [site] = [factory.wrappedFactory for port, factory, _, interface in reactor.tcpServers
              if (port, interface) == (9100, "0.0.0.0")]
    stub = StubTreq(site.resource)
    statuses = {}
    for path in ("/metrics", "/health", "/api/queues", "/", "/api/queues/q/messages"):
        response = stub.get("http://mq.test" + path)
        stub.flush()
        statuses[path] = response.result.code
    assert statuses == {"/metrics": 200, "/health": 200, "/api/queues": 404, "/": 404,
                        "/api/queues/q/messages": 404}
    assert service.stopService().called


def test_http_token_options_are_checked(tmp_path):
    with pytest.raises(usage.UsageError, match="not both"):
        parse("--http-token=a", f"--http-token-file={tmp_path / 'token'}")
    with pytest.raises(usage.UsageError, match="cannot read --http-token-file"):
        parse(f"--http-token-file={tmp_path / 'missing'}")
    (tmp_path / "empty").write_text("  \n")
    with pytest.raises(usage.UsageError, match="is empty"):
        parse(f"--http-token-file={tmp_path / 'empty'}")
    with pytest.raises(usage.UsageError, match="--http-read-token or --http-read-token-file"):
        parse("--http-read-token=a", f"--http-read-token-file={tmp_path / 'token'}")
    with pytest.raises(usage.UsageError, match="cannot read --http-read-token-file"):
        parse(f"--http-read-token-file={tmp_path / 'missing'}")
    (tmp_path / "reader").write_text("r3ad\n")
    assert parse(f"--http-read-token-file={tmp_path / 'reader'}")["http-read-token"] == "r3ad"


@pytest.mark.parametrize(
    ("args", "storage", "location"),
    [
        ((), "SQLiteStore", "mqserver.sqlite3"),
        (("--storage=log", "--fsync=always", "--log-segment-mb=1", "--log-checkpoint=16:2"),
         "LogStore", "log"),
    ],
)
def test_durable_storage_creates_the_data_dir(tmp_path, args, storage, location):
    data = tmp_path / "new" / "data"
    options = parse("--protocol", "mqks:tcp:0:interface=127.0.0.1", f"--data-dir={data}", *args)
    service = tap.makeService(options, reactor=MemoryReactorClock())
    store = service.broker.store
    assert type(store).__name__ == storage
    assert data.is_dir()
    assert str(getattr(store, "path", None) or store.directory) == str(data / location)
    assert list(data.iterdir()) == []  # nothing is opened before the service starts
    if storage == "LogStore":
        assert (store.checkpoints.every_bytes, store.checkpoints.every_seconds) == (16 << 20, 2)


def twistd_options(*args: str) -> tap.Options:
    """The mqserver options as ``twistd ARGS mqserver --storage=memory`` parses them."""
    from twisted.scripts.twistd import ServerOptions

    twistd = ServerOptions()
    twistd.parseOptions([*args, "mqserver", "--storage=memory"])
    return twistd.subOptions


@pytest.mark.parametrize(
    ("args", "early"),
    [(("-n",), True), (("--nodaemon", "--pidfile="), True), ((), False),
     (("-n", "--uid=0"), False), (("-n", "--gid=0"), False), (("-n", "--chroot=/"), False),
     (("-n", "--rundir=/tmp"), False), (("-n", "--umask=022"), False)],
)
def test_the_store_opens_early_only_when_twistd_leaves_the_process_as_it_is(args, early):
    assert tap.opens_early(twistd_options(*args)) is early


def test_the_store_opens_early_under_twist():
    from twisted.application.twist._options import TwistOptions

    options = parse("--storage=memory")
    options.parent = TwistOptions()  # what parsing ``twist mqserver ...`` sets
    assert tap.opens_early(options)


def test_options_parsed_without_twistd_never_open_early():
    assert not tap.opens_early(parse("--storage=memory"))


def test_memory_storage_creates_no_data_dir(tmp_path):
    options = parse("--storage=memory", f"--data-dir={tmp_path / 'data'}")
    tap.makeService(options, reactor=MemoryReactorClock())
    assert not (tmp_path / "data").exists()


@pytest.mark.parametrize(
    "args",
    [("--sqlite-sync=off",), ("--fsync=sometimes",), ("--fsync=interval:0",),
     ("--fsync=interval:",), ("--log-segment-mb=big",), ("--log-checkpoint=64",),
     ("--log-checkpoint=x:5",)],
)
def test_bad_storage_options_are_usage_errors(args):
    with pytest.raises(usage.UsageError):
        parse(*args)


def test_storage_options_parse():
    options = parse("--storage=log", "--fsync=interval:10", "--sqlite-sync=normal")
    assert (options["fsync"], options["sqlite-sync"]) == ("interval:10", "normal")


#: what no configuration needs before ``makeService`` (twistd imports this
#: module to parse the options, ``--help`` and ``--version`` included)
NOT_FOR_OPTIONS = ("twisted.web", "prometheus_client", "sqlite_utils", "psycopg", "zmq",
                   "mqserver.broker.core", "mqserver.storage.sqlite", "mqserver.protocols.mqks",
                   "mqserver.web", "mqserver.journal.writer", "mqserver.analytics")
#: what an MQKS-only server on memory without HTTP never imports
NOT_FOR_MQKS_MEMORY = ("twisted.web", "prometheus_client", "sqlite_utils", "psycopg", "zmq",
                       "mqserver.storage.sqlite", "mqserver.storage.log", "mqserver.web",
                       "mqserver.protocols.phpmq", "mqserver.protocols.emqp", "mqserver.zmtp",
                       "mqserver.journal.writer", "mqserver.analytics")
IMPORTED = """
import json, sys
from twisted.internet.testing import MemoryReactorClock
import twisted.plugins.mqserver_plugin
from mqserver import tap
options = tap.Options()
options.parseOptions(sys.argv[1:])
parsed = sorted(sys.modules)
tap.makeService(options, reactor=MemoryReactorClock())
print(json.dumps([parsed, sorted(sys.modules)]))
"""


def imported(tmp_path, *args: str) -> tuple[set[str], set[str]]:
    """Modules a fresh interpreter holds after parsing ``args``, and after ``makeService``."""
    run = subprocess.run([sys.executable, "-c", IMPORTED, "--no-gc-tuning",
                          f"--data-dir={tmp_path / 'data'}", *args],
                         cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]
    parsed, made = json.loads(run.stdout.splitlines()[-1])
    return set(parsed), set(made)


def under(modules: set[str], packages: tuple[str, ...]) -> set[str]:
    return {m for m in modules if any(m == p or m.startswith(p + ".") for p in packages)}


def test_a_configuration_imports_only_what_it_needs(tmp_path):
    parsed, made = imported(tmp_path, "--storage=memory", "--no-http",
                            "--protocol=mqks:tcp:0:interface=127.0.0.1")
    assert under(parsed, NOT_FOR_OPTIONS) == set()
    assert under(made, NOT_FOR_MQKS_MEMORY) == set()
    assert {"mqserver.broker.core", "mqserver.protocols.mqks.protocol"} <= made

    # the same imports appear once a configuration asks for them
    _, made = imported(tmp_path, "--storage=sqlite", "--http=tcp:0:interface=127.0.0.1",
                       "--protocol=phpmq:tcp:0:interface=127.0.0.1")
    assert {"mqserver.storage.sqlite", "twisted.web.server", "prometheus_client",
            "mqserver.protocols.phpmq.protocol"} <= made
    assert under(made, ("mqserver.protocols.mqks", "mqserver.protocols.emqp", "zmq")) == set()


WITH_THE_REACTOR = """
import json, sys
import twisted.plugins.mqserver_plugin
from mqserver import tap
options = tap.Options()
options.parseOptions(sys.argv[1:])
tap.makeService(options)
print(json.dumps([sys.modules.get("OpenSSL", "absent") is None, "cryptography" in sys.modules]))
"""


def tls_imports(tmp_path, *args: str) -> list[bool]:
    """[OpenSSL left out, cryptography imported] after ``makeService`` imports the reactor."""
    run = subprocess.run([sys.executable, "-c", WITH_THE_REACTOR, "--storage=memory",
                          f"--data-dir={tmp_path / 'data'}", *args],
                         cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.splitlines()[-1])


def test_plain_listeners_start_without_pyopenssl_and_tls_ones_with_it(tmp_path):
    from tests.integration.test_tls import self_signed

    # every built-in listener on its default (plain TCP) endpoint
    assert tls_imports(tmp_path) == [True, False]
    key, cert = self_signed(tmp_path)
    tls = f"ssl:0:interface=127.0.0.1:privateKey={key}:certKey={cert}"
    # one TLS listener among plain ones, an eMQP one that --protocol does not name
    assert tls_imports(tmp_path, f"--emqp-admin={tls}") == [False, True]


def test_listener_endpoints_are_every_protocol_extra_and_http_one():
    options = parse("--protocol=mqks:tcp:1", "--protocol=emqp:tcp:2", "--emqp-backend=unix:/b",
                    "--emqp-admin=tcp:4", "--http=tcp:5", "--metrics=tcp:6")
    assert sorted(tap.listener_endpoints(options)) == \
        ["tcp:1", "tcp:2", "tcp:4", "tcp:5", "tcp:6", "unix:/b"]


def test_a_protocol_with_unnamed_extra_listeners_leaves_the_endpoints_unknown(monkeypatch):
    class Unnamed:  # a plugin written before extra_endpoint_options
        def extra_listeners(self, broker, config):
            return []

    monkeypatch.setitem(tap._PROTOCOLS, "mqks", Unnamed())
    assert tap.listener_endpoints(parse("--protocol=mqks:tcp:1")) is None
