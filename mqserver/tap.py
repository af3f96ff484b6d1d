# -*- test-case-name: tests.unit.test_tap -*-
"""``twistd mqserver``: options and ``makeService``.

Protocols and storage backends are plugins (``IProtocolPlugin``,
``IStoragePlugin``) found with ``twisted.plugin.getPlugins``, so a third party
adds one by shipping a module in its own ``twisted/plugins/``.  A protocol
listens on its ``--protocol`` endpoint plus whatever its ``extra_listeners``
returns (eMQP's backend and admin sockets), each logged as
``"{label} listening on {host}:{port}"``.  Their extra
options are merged into ``Options`` when this module is imported.

Importing this module (twistd does, to parse the options) stays light: what
a configuration needs is imported by ``makeService`` when it needs it (the
endpoint parser with its TLS stack, the chosen backend, the protocols
listened on, the HTTP stack only with an HTTP listener).
"""

from __future__ import annotations

import gc
import os
import sys
from typing import Any

from twisted.application.service import IService, Service
from twisted.logger import Logger
from twisted.plugin import getPlugins
from twisted.python import usage

from mqserver.broker.flow import parse_watermark, watermark_bytes
from mqserver.broker.overflow import check_policy
from mqserver.broker.ready import PACK_READY_AFTER
from mqserver.connlimits import DEFAULT_MAX_CONNECTIONS, DEFAULT_MAX_PER_IP
from mqserver.limits import DEFAULT_MAX_NAMES, positive

log = Logger()


def available_protocols() -> dict[str, Any]:
    from mqserver.interfaces import IProtocolPlugin

    return {plugin.name: plugin for plugin in getPlugins(IProtocolPlugin)}


def available_storage() -> dict[str, Any]:
    from mqserver.interfaces import IStoragePlugin

    return {plugin.name: plugin for plugin in getPlugins(IStoragePlugin)}


def _plugin_options(*registries: dict[str, Any]) -> list[list[Any]]:
    seen: set[str] = set()
    rows = []
    for registry in registries:
        for name in sorted(registry):
            for row in registry[name].options:
                if row[0] not in seen:
                    seen.add(row[0])
                    rows.append(list(row))
    return rows


_PROTOCOLS = available_protocols()
_STORAGE = available_storage()


class Options(usage.Options):
    synopsis = "[--protocol NAME[:ENDPOINT]]... [--storage NAME] [options]"
    longdesc = (
        "Runs the mqserver broker.  With no --protocol, every built-in protocol "
        "listens on its default endpoint (bound to 127.0.0.1).  Protocols: "
        + ", ".join(f"{n} ({p.default_endpoint})" for n, p in sorted(_PROTOCOLS.items()))
        + ".  Storage backends: "
        + ", ".join(f"{n} ({p.description})" for n, p in sorted(_STORAGE.items()))
        + "."
    )
    optParameters = [
        ["storage", "s", "sqlite", "Storage backend: " + ", ".join(sorted(_STORAGE)) + "."],
        ["data-dir", "d", "data",
         "Directory for durable storage backends; created if missing."],
        ["ttl-interval", None, 1.0, "Seconds between sweeps for expired messages.", float],
        ["dispatch-batch", None, 1024,
         "Most messages one queue dispatches per reactor turn.", int],
        ["http", None, "tcp:8080:interface=127.0.0.1",
         "Endpoint of the HTTP API, metrics and dashboard (see docs/http.md)."],
        ["http-token", None, None,
         "Bearer token for every HTTP request that changes anything or shows message "
         "bodies or client addresses; without one (or --http-token-file) the HTTP API "
         "only shows health, metrics and queue statistics."],
        ["http-token-file", None, None, "Read the HTTP bearer token from this file."],
        ["http-read-token", None, None,
         "A second bearer token that allows only the reads (peeking at messages, listing "
         "connections), e.g. for a support team's dashboard."],
        ["http-read-token-file", None, None, "Read the HTTP read token from this file."],
        ["metrics", None, None,
         "Also serve /health and /metrics, and nothing else, on this endpoint: for a "
         "Prometheus or load-balancer port on another interface while the API and the "
         "dashboard stay on --http (see docs/operations.md)."],
        ["http-max-body", None, 16 * 1024 * 1024,
         "Largest HTTP request body in bytes; larger ones get 413.", int],
        ["http-max-batch", None, 10_000,
         "Most messages one HTTP batch publish may carry, and ids one ack or reject may "
         "list; more get 413.", positive],
        ["max-name-bytes", None, 255,
         "Longest queue or event name (or mask) in bytes, every protocol; names are also "
         "refused if empty or holding control characters.  See docs/operations.md.", positive],
        ["max-id-bytes", None, 255,
         "Longest message, request or consumer id in bytes, every protocol.", positive],
        ["max-headers", None, 64,
         "Most header fields one message may carry (eMQP header items, HTTP 'headers').",
         positive],
        ["max-names-per-request", None, DEFAULT_MAX_NAMES,
         "Most queue or event names one request may list (an MQKS consume or rebind, an "
         "eMQP worker's INFORM); more get the protocol's error.", positive],
        ["max-queue-length", None, 0,
         "Most ready messages a queue holds unless it sets its own max_length; 0: no limit.",
         int],
        ["pack-ready-after", None, PACK_READY_AFTER,
         "Ready messages a queue keeps as Python objects; past this, later ones are "
         "kept packed (about 125 instead of 350 bytes per 100-byte message, about 1 us "
         "more CPU each); 0: never pack.", int],
        ["pack-at-rest", None, 1.0,
         "Seconds between looks for ready backlogs at rest: one of 4,096 or more messages "
         "that fewer than 1,024 went through since the last look is packed whole, not "
         "only past --pack-ready-after (the log store's index of it too); 0: never.", float],
        ["overflow", None, "drop-head",
         "What a full queue does with a new publish unless it sets its own: drop-head "
         "(drop or dead-letter the oldest) or reject-publish (refuse the publish).",
         check_policy],
        ["memory-high-watermark", None, 0.4,
         "Stop reading from publishing connections while the server's RSS is at or above "
         "this: a fraction of RAM, bytes, or KiB/MiB/GiB; 0: off.", parse_watermark],
        ["memory-check-interval", None, 1.0, "Seconds between memory measurements.", float],
        ["max-connections", None, DEFAULT_MAX_CONNECTIONS,
         "Most client connections open at once, over every listener (HTTP included); "
         "more are closed at once (MQKS gets an error line first); 0: no limit.", int],
        ["max-connections-per-ip", None, DEFAULT_MAX_PER_IP,
         "Most client connections open at once from one IP address; 0: no limit.  "
         "Loopback and Unix-socket clients count only toward --max-connections (see "
         "--limit-loopback-per-ip).", int],
        ["journal", None, None,
         "Write a journal of broker events (JSON lines) under this directory; off by "
         "default.  See docs/analytics.md."],
        ["journal-node", None, None, "Node name in journal records (default: the host name)."],
        ["journal-segment-bytes", None, 64 * 1024 * 1024,
         "Seal a journal segment once it holds this many bytes.", int],
        ["journal-segment-seconds", None, 300.0,
         "Seal a journal segment once it is this many seconds old.", float],
        ["ha-node", None, None,
         "--ha: this node's name in the lease row and logs (default: host name and pid)."],
        ["ha-lease", None, 5.0,
         "--ha: seconds the active's lease lasts; a hung or cut-off active is replaced "
         "about this long after its last renewal (docs/ha.md).", float],
        ["ha-renew", None, 1.0, "--ha: seconds between the active's lease renewals.", float],
        ["ha-poll", None, 0.5,
         "--ha: seconds between a standby's attempts to take the claim; bounds the "
         "takeover after a kill -9 of the active.", float],
        *_plugin_options(_PROTOCOLS, _STORAGE),
    ]
    optFlags = [
        ["no-gc-tuning", None, "Do not freeze start-up objects or raise the GC threshold."],
        ["no-http", None, "Do not serve the HTTP API, metrics and dashboard."],
        ["limit-loopback-per-ip", None, "Count loopback clients (127.0.0.0/8, ::1) against "
         "--max-connections-per-ip too (by default they are this host's own processes and "
         "count only toward --max-connections)."],
        ["ha", None, "Active/standby on a shared PostgreSQL database (--storage=postgres): "
         "serve only while this node holds the claim, else stand by (docs/ha.md)."],
        ["journal-bodies", None, "Also journal message bodies (base64) and so allow an archive "
         "with bodies."],
    ]

    def __init__(self) -> None:
        super().__init__()
        self["protocols"] = []

    def opt_protocol(self, value: str) -> None:
        """Listen with protocol NAME on ENDPOINT (a Twisted endpoint string,
        e.g. mqks:tcp:25000:interface=127.0.0.1); repeatable.  Without an
        endpoint the protocol's default is used."""
        name, _, endpoint = value.partition(":")
        if name not in _PROTOCOLS:
            raise usage.UsageError(
                f"unknown protocol {name!r}; available: {', '.join(sorted(_PROTOCOLS))}"
            )
        self["protocols"].append((name, endpoint or _PROTOCOLS[name].default_endpoint))

    opt_p = opt_protocol

    def opt_version(self) -> None:
        """Print mqserver's and Twisted's versions and exit."""
        # overrides usage.Options, which prints only Twisted's: a bug report
        # needs the broker's own version first
        import sys

        from mqserver import __version__
        from twisted import copyright

        print(f"mqserver {__version__} (Twisted {copyright.version})")
        sys.exit(0)

    def postOptions(self) -> None:
        if self["storage"] not in _STORAGE:
            raise usage.UsageError(
                f"unknown storage {self['storage']!r}; available: {', '.join(sorted(_STORAGE))}"
            )
        if self["ha"] and self["storage"] != "postgres":
            raise usage.UsageError("--ha needs --storage=postgres")
        if not self["protocols"]:
            self["protocols"] = [
                (name, plugin.default_endpoint) for name, plugin in sorted(_PROTOCOLS.items())
            ]
        for name in ("http-token", "http-read-token"):
            self._token_from_file(name)

    def _token_from_file(self, name: str) -> None:
        """``--NAME-file``'s token as ``--NAME`` (a typo in the path stops start-up)."""
        if not self[f"{name}-file"]:
            return
        if self[name]:
            raise usage.UsageError(f"give --{name} or --{name}-file, not both")
        from mqserver.web import read_token

        try:
            self[name] = read_token(self[f"{name}-file"], f"--{name}-file")
        except ValueError as e:
            raise usage.UsageError(str(e)) from None


class Listener(Service):
    """Listens on one endpoint and logs the address it got (ephemeral ports included)."""

    def __init__(self, protocol: str, endpoint: Any, factory: Any, reactor: Any) -> None:
        self.protocol = protocol
        self.endpoint = endpoint
        self.factory = factory
        self.reactor = reactor
        self.port: Any = None

    def startService(self) -> None:
        super().startService()
        d = self.endpoint.listen(self.factory)
        d.addCallbacks(self._listening, self._failed)

    def _listening(self, port: Any) -> None:
        self.port = port
        address = port.getHost()
        log.info(
            "{protocol} listening on {host}:{port}",
            protocol=self.protocol,
            host=getattr(address, "host", address),
            port=getattr(address, "port", ""),
        )
        # a protocol that tells clients where it listens (MQKS's config['workers'])
        factory = getattr(self.factory, "wrappedFactory", self.factory)
        listening = getattr(factory, "listening", None)
        if listening is not None:
            listening(address)

    def _failed(self, failure: Any) -> None:
        log.failure("{protocol} could not listen", failure, protocol=self.protocol)
        from mqserver.broker.service import stop_with_error

        stop_with_error(self.reactor)

    def stopService(self) -> Any:
        super().stopService()
        if self.port is not None:
            port, self.port = self.port, None
            return port.stopListening()
        return None


def makeService(config: Options, reactor: Any = None) -> IService:
    if not config["no-gc-tuning"]:
        # What twistd imported so far lives as long as the process: frozen
        # now, the collections while the rest is imported and the store
        # recovers skip it (BrokerService freezes the rest after the load).
        # It holds no garbage to keep (a full collection here finds none);
        # freezing it saves tens of ms of start-up.
        gc.freeze()
    if reactor is None:
        from mqserver.tls_import import leave_out_tls

        # before the reactor's import looks for pyOpenSSL (some 45 ms)
        leave_out_tls(listener_endpoints(config))
        from twisted.internet import reactor as default_reactor

        reactor = default_reactor
    from twisted.internet import endpoints

    from mqserver.connlimits import ConnectionLimits, GuardedFactory

    limits = ConnectionLimits(config["max-connections"], config["max-connections-per-ip"],
                              loopback_per_ip=bool(config["limit-loopback-per-ip"]))
    if config["ha"]:
        from mqserver.ha.node import build_node

        return build_node(config, reactor, limits)
    store = _STORAGE[config["storage"]].build_store(config, reactor)
    opening = None
    if store.durable and opens_early(config):
        # the store's thread reads while the protocols and HTTP are imported;
        # BrokerService still listens only once this fires
        os.makedirs(config["data-dir"], exist_ok=True)
        opening = store.open()
    service = build_broker_service(config, reactor, store, limits)
    service.opening = opening
    for label, description, site in http_sites(config, service.broker):
        endpoint = endpoints.serverFromString(reactor, description)
        Listener(label, endpoint, GuardedFactory(site, limits, label, reactor),
                 reactor).setServiceParent(service)
    return service


def opens_early(config: Options) -> bool:
    """Whether ``makeService`` may open the store at once, before twistd starts the service.

    Only when twistd changes nothing about the process in between: no fork
    (the store's thread would not survive it), and no new user, group,
    root, directory or umask (files the open makes would be made as they
    were before).  That is ``twist`` (the systemd unit's runner: it never
    does any of these) and ``twistd -n`` with none of ``--uid``, ``--gid``,
    ``--chroot``, ``--rundir`` or ``--umask``.  Options parsed on their own
    (no runner around them) never do.
    """
    twistd = getattr(config, "parent", None)
    # imported by ``twist`` before it parses; not imported here otherwise
    twist = sys.modules.get("twisted.application.twist._options")
    if twist is not None and isinstance(twistd, twist.TwistOptions):
        return True
    if twistd is None or not twistd.get("nodaemon"):
        return False
    return (all(twistd.get(name, "") is None for name in ("uid", "gid", "chroot", "umask"))
            and twistd.get("rundir") == ".")


def build_broker_service(config: Options, reactor: Any, store: Any, limits: Any,
                         wrap: Any = None) -> Any:
    """The broker over ``store``, as a service with a child per protocol listener.

    Everything but the HTTP sites (``http_sites``), which an active/standby
    node (``mqserver.ha``) keeps listening while it builds a broker each time
    it becomes active; ``wrap(factory)``, if given, wraps each protocol
    listener's factory (the node's fence).
    """
    from twisted.internet import endpoints

    from mqserver.broker.core import Broker
    from mqserver.broker.service import BrokerService
    from mqserver.connlimits import GuardedFactory

    if store.durable:
        # here rather than in each backend: a missing ./data/ is the normal
        # first run, and a path that cannot be created fails before twistd
        # daemonizes, with the reason on the terminal
        os.makedirs(config["data-dir"], exist_ok=True)
    broker = Broker(store, reactor, dispatch_batch=config["dispatch-batch"])
    broker.set_limits(config["max-queue-length"], config["overflow"])
    broker.pack_ready_after = config["pack-ready-after"]
    broker.flow.configure(
        watermark_bytes(config["memory-high-watermark"]), config["memory-check-interval"]
    )
    service = BrokerService(
        broker, ttl_interval=config["ttl-interval"], tune_gc=not config["no-gc-tuning"],
        pack_at_rest=config["pack-at-rest"],
    )
    if config["journal"]:
        from mqserver.journal.writer import Journal

        # the first child: started once storage is loaded, stopped (flushed and
        # sealed) after every listener
        journal = Journal(
            config["journal"], reactor, node=config["journal-node"],
            bodies=bool(config["journal-bodies"]),
            segment_bytes=config["journal-segment-bytes"],
            segment_seconds=config["journal-segment-seconds"],
            process_reactor=reactor,
        )
        journal.setServiceParent(service)
        broker.journal = journal
    broker.connection_limits = limits

    def guarded(factory: Any, label: str, idle: float | None = None) -> GuardedFactory:
        return GuardedFactory(factory, limits, label, reactor, idle)

    extras_started: set[str] = set()
    for name, description in config["protocols"]:
        factory = _PROTOCOLS[name].build_factory(broker, config)
        if wrap is not None:
            factory = wrap(factory)
        endpoint = endpoints.serverFromString(reactor, description)
        # a protocol's --NAME-idle-timeout, if it has one (eMQP has heartbeats instead)
        factory = guarded(factory, name, config.get(f"{name}-idle-timeout"))
        Listener(name, endpoint, factory, reactor).setServiceParent(service)
        if name in extras_started:
            continue
        extras_started.add(name)
        # further sockets of the same protocol (eMQP's backend and admin); a
        # third-party plugin written before extra_listeners existed has none
        extra_listeners = getattr(_PROTOCOLS[name], "extra_listeners", None)
        extras = extra_listeners(broker, config) if extra_listeners is not None else []
        for label, extra, extra_factory in extras:
            endpoint = endpoints.serverFromString(reactor, extra)
            if wrap is not None:
                extra_factory = wrap(extra_factory)
            Listener(label, endpoint, guarded(extra_factory, label), reactor).setServiceParent(
                service
            )
    return service


def http_endpoints(config: Options) -> list[tuple[str, str]]:
    """``(label, endpoint)`` of the HTTP API (``--http``) and ``--metrics``, those that are on."""
    found = [] if config["no-http"] else [("http", config["http"])]
    return found + ([("metrics", config["metrics"])] if config["metrics"] else [])


def listener_endpoints(config: Options) -> list[str] | None:
    """Every endpoint ``makeService`` will listen on, known before it builds
    anything; None if a protocol has extra listeners it does not name
    (``extra_endpoint_options``)."""
    found = [description for _, description in config["protocols"]]
    for name in {name for name, _ in config["protocols"]}:
        plugin = _PROTOCOLS[name]
        options = getattr(plugin, "extra_endpoint_options", None)
        if options is None:
            return None
        found += [str(config[option]) for option in options]
    return found + [description for _, description in http_endpoints(config)]


def http_sites(config: Options, broker: Any) -> list[tuple[str, str, Any]]:
    """``(label, endpoint, site)`` for each of ``http_endpoints``: the sites serving ``broker``.

    Without one (``--no-http`` and no ``--metrics``) twisted.web and
    prometheus_client are never imported.
    """
    chosen = http_endpoints(config)
    if not chosen:
        return []
    from mqserver.limits import Limits
    from mqserver.web import metrics
    from mqserver.web.app import build_site

    sites = []
    for label, description in chosen:
        if label == "http":
            site = build_site(
                broker, token=config["http-token"], max_body=config["http-max-body"],
                storage_name=config["storage"], limits=Limits.from_config(config),
                read_token=config["http-read-token"], max_batch=config["http-max-batch"])
        else:
            site = build_site(broker, storage_name=config["storage"], routes=metrics.ROUTES)
        sites.append((label, description, site))
    return sites
