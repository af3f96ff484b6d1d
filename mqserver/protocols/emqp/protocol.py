# -*- test-case-name: tests.unit.test_emqp_plugin -*-
"""The three eMQP listeners as the plugin hands them to ``twistd mqserver``.

``--protocol=emqp[:ENDPOINT]`` is the frontend (clients and schedulers);
``--emqp-backend`` (workers) and ``--emqp-admin`` are extra listeners of the
same ``EMQPService``, which is why the service is built once per broker and
shared by ``build_factory`` and ``extra_listeners``.
"""

from __future__ import annotations

import weakref
from typing import Any

from mqserver.limits import Limits
from mqserver.protocols.emqp.service import EMQPService
from mqserver.zmtp.router import DEFAULT_MAX_FRAMES

FRONTEND = "tcp:47291:interface=127.0.0.1"
BACKEND = "tcp:47290:interface=127.0.0.1"
ADMIN = "tcp:47293:interface=127.0.0.1"

_services: weakref.WeakKeyDictionary[Any, EMQPService] = weakref.WeakKeyDictionary()


def _stop_reactor(clock: Any) -> Any:
    """DISCONNECT stops the server, as it stops the original router."""

    def stop() -> None:
        if getattr(clock, "running", False):
            clock.stop()

    return stop


def service_for(broker: Any, config: Any) -> EMQPService:
    """The one ``EMQPService`` of ``broker``, made from the parsed options on first use."""
    service = _services.get(broker)
    if service is None:
        service = EMQPService(
            broker,
            max_message_size=int(config.get("emqp-max-message", 64 * 1024 * 1024)),
            heartbeat_interval=float(config.get("emqp-heartbeat", 3.0)),
            peer_timeout=float(config.get("emqp-peer-timeout", 5.0)),
            drain_timeout=float(config.get("emqp-drain-timeout", 10.0)),
            dead_letter=str(config.get("emqp-dead-letter", "")).encode("utf-8"),
            on_disconnect=_stop_reactor(broker.clock),
            max_frames=int(config.get("emqp-max-frames", DEFAULT_MAX_FRAMES)),
            limits=Limits.from_config(config),
        )
        _services[broker] = service
    return service


def extra_listeners(broker: Any, config: Any) -> list[tuple[str, str, Any]]:
    service = service_for(broker, config)
    return [
        ("emqp-backend", str(config.get("emqp-backend", BACKEND)), service.backend),
        ("emqp-admin", str(config.get("emqp-admin", ADMIN)), service.admin),
    ]
