"""The systems under test: mqserver per protocol and storage setup, and the peers."""

from __future__ import annotations

from dataclasses import dataclass

from bench.clients import LoadClient
from bench.clients.beanstalk import BeanstalkClient
from bench.clients.emqp import EMQPClient
from bench.clients.http import HTTPClient
from bench.clients.mqks import MQKSClient
from bench.clients.phpmq import PHPMQClient
from bench.clients.redis import RedisClient
from bench.peers import PEERS
from bench.servers import STORAGES

PROTOCOLS: dict[str, type[LoadClient]] = {
    "mqks": MQKSClient, "phpmq": PHPMQClient, "emqp": EMQPClient, "http": HTTPClient,
}
DURABLE = {"sqlite", "log-interval", "log-always", "beanstalkd-b", "beanstalkd-b-f0",
           "redis-aof-everysec", "redis-aof-always", "postgres"}
IN_MEMORY = {"memory", "beanstalkd", "redis"}
EMQP_SCALE = 0.5
PEER_SCALE = {"beanstalkd-b-f0": 0.02}
MEMORY = {"mqks/memory", "mqks/sqlite", "mqks/log-interval", "beanstalkd", "redis"}


@dataclass(frozen=True)
class System:
    """One client kind against one server setup."""

    name: str  #: "mqks/memory", "beanstalkd-b-f0", ...
    server: str  #: a key of STORAGES (an mqserver) or of PEERS
    client: type[LoadClient]
    scale: float = 1.0  #: share of N it runs (see ``all_systems``)

    @property
    def peer(self) -> bool:
        return self.server in PEERS

    @property
    def durable(self) -> bool:
        return self.server in DURABLE

    @property
    def in_memory(self) -> bool:
        return self.server in IN_MEMORY


def all_systems(http_scale: float) -> list[System]:
    """Every protocol on every storage setup, then the peers.  HTTP (``--http-scale``;
    its drain, a JSON view per message, runs at about a tenth of MQKS's), eMQP
    (a pyzmq call per message; about 10k msgs/s) and ``beanstalkd -b -f0``
    (an fsync per put) run a share of N so a round stays within seconds;
    rates do not depend on N at these sizes."""
    scale = {"http": http_scale, "emqp": EMQP_SCALE}
    systems = [System(f"{protocol}/{storage}", storage, client, scale.get(protocol, 1.0))
               for storage in STORAGES for protocol, client in PROTOCOLS.items()]
    for peer in PEERS:
        client = BeanstalkClient if peer.startswith("beanstalkd") else RedisClient
        systems.append(System(peer, peer, client, PEER_SCALE.get(peer, 1.0)))
    return systems


def workload_systems(workload: str, systems: list[System]) -> list[System]:
    """Which systems run ``workload``: W1 everything (it is W3 on a durable
    backend); W2 the in-memory ones; paced latency the in-memory stream
    protocols; memory MQKS per backend (the fsync mode does not change
    what is kept) and the peers without persistence."""
    if workload == "w1":
        return systems
    if workload == "w2":
        return [s for s in systems if s.in_memory]
    if workload == "paced":
        return [s for s in systems if s.in_memory and not s.name.startswith("http")]
    if workload == "memory":
        return [s for s in systems if s.name in MEMORY]
    raise ValueError(workload)
