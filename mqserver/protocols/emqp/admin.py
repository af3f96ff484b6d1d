# -*- test-case-name: tests.unit.test_emqp_protocol -*-
"""The admin socket (47293): STATUS, ROUTER_SHOW_WORKERS, ROUTER_SHOW_SCHEDULERS, DISCONNECT.

Answers are ``REPLY <json>`` with the original router's keys, so ``emq-cli``
reads them.  Identities that are not printable UTF-8 appear as ``0x`` + hex.
"""

from __future__ import annotations

import json
from typing import Any

from twisted.logger import Logger

from mqserver.protocols.emqp import codec
from mqserver.protocols.emqp.codec import EMQPError
from mqserver.protocols.emqp.endpoint import EndpointHandler
from mqserver.protocols.emqp.service import EMQPService
from mqserver.zmtp.codec import describe
from mqserver.zmtp.router import UnroutableError, ZMTPRouterFactory

log = Logger()


def _name(value: bytes) -> str:
    return value.decode("utf-8", "backslashreplace")


def status(service: EMQPService) -> dict[str, Any]:
    """Waiting, in-flight, processed and latency figures per queue (and per worker)."""
    now = service.clock.seconds()
    inflight: dict[str, int] = {}
    latency: dict[str, int] = {}
    max_latency: dict[str, int] = {}
    waiting: dict[str, int] = {}
    processed: dict[str, int] = {}
    names = {name for worker in service.workers.values() for _, name in worker.queues}
    for name, queue in service.broker.queues.items():
        if not (
            name in names
            or (queue.ready and queue.ready[0].source == "emqp")
            or any(c.connection.protocol == "emqp" for c in queue.consumers)
        ):
            continue
        key = _name(name)
        waiting[key] = len(queue.ready)
        processed[key] = queue.delivered
        ages = [
            now - m.created_at
            for c in queue.consumers if c.connection.protocol == "emqp"
            for m in c.unacked.values()
        ]
        if ages:
            inflight[key] = len(ages)
            latency[key] = int(sum(ages) / len(ages) * 1000)
            max_latency[key] = int(max(ages) * 1000)
    return {
        "inflight_messages_by_queue": inflight,
        "latency_messages_by_queue": latency,
        "max_latency_messages_by_queue": max_latency,
        "waiting_messages_by_queue": waiting,
        "processed_messages_by_queue": processed,
        "processed_messages_by_worker": {
            describe(w.identity): w.processed for w in service.workers.values()
        },
        "scheduled_jobs": len(service.scheduler.jobs),
        "draining": service.draining,
    }


def workers(service: EMQPService) -> dict[str, Any]:
    connected = {}
    queues: dict[str, list[list[Any]]] = {}
    for worker in service.workers.values():
        wid = describe(worker.identity)
        connected[wid] = {
            "queues": [[weight, _name(name)] for weight, name in worker.queues],
            "hb": worker.last_seen,
            "available_slots": worker.slots.free,
            "in_flight": worker.in_flight(),
        }
        for weight, name in worker.queues:
            queues.setdefault(_name(name), []).append([weight, wid])
    for entries in queues.values():
        entries.sort(key=lambda entry: -entry[0])
    return {"connected_workers": connected, "connected_queues": queues}


def schedulers(service: EMQPService) -> dict[str, Any]:
    return {
        "connected_schedulers": {
            describe(p.identity): {"hb": p.last_seen} for p in service.schedulers.values()
        },
        "scheduled_jobs": {
            key: {
                "queue": _name(job.schedule.queue),
                "interval": job.schedule.interval,
                "cron": _name(job.schedule.cron),
                "next_run": job.next_run,
            }
            for key, job in service.scheduler.jobs.items()
        },
    }


class AdminHandler(EndpointHandler):
    def __init__(self, service: EMQPService) -> None:
        super().__init__(service)
        self._views = {
            codec.STATUS: status,
            codec.SHOW_WORKERS: workers,
            codec.SHOW_SCHEDULERS: schedulers,
        }

    # RouterHandler
    def message_received(
        self, router: ZMTPRouterFactory, identity: bytes, frames: list[bytes]
    ) -> None:
        try:
            envelope = codec.parse(frames, self.service.limits)
        except EMQPError as e:
            log.warn("emqp-admin: dropped a malformed message: {e}", e=e)
            return
        command = envelope.command
        if command == codec.DISCONNECT:
            log.info("emqp-admin: DISCONNECT from {id}", id=describe(identity))
            self._send(identity, codec.message(codec.ACK, envelope.msgid))
            self.service.disconnect()
            return
        view = self._views.get(command)
        if view is None:
            log.warn("emqp-admin: dropped unknown command {cmd!r}", cmd=command[:40])
            return
        body = json.dumps(view(self.service)).encode("utf-8")
        self._send(identity, codec.message(codec.REPLY, body))

    def _send(self, identity: bytes, frames: list[bytes]) -> None:
        try:
            self.service.admin.send(identity, frames)
        except UnroutableError:
            log.debug("emqp-admin: {id} left before its answer", id=describe(identity))
