"""The systems under test: mqserver per protocol and storage setup, and the peers."""

from __future__ import annotations

from dataclasses import dataclass

from bench.clients import LoadClient
from bench.clients.amqp import AMQPClient, DurableAMQPClient, QuorumAMQPClient
from bench.clients.beanstalk import BeanstalkClient
from bench.clients.emqp import EMQPClient
from bench.clients.http import HTTPClient
from bench.clients.mqks import MQKSClient
from bench.clients.nats import JetStreamClient, JetStreamFileClient
from bench.clients.phpmq import PHPMQClient
from bench.clients.redis import RedisClient
from bench.peers import PEERS
from bench.servers import STORAGES

PROTOCOLS: dict[str, type[LoadClient]] = {
    "mqks": MQKSClient, "phpmq": PHPMQClient, "emqp": EMQPClient, "http": HTTPClient,
}
#: peer system -> (the PEERS server it runs on, its client)
PEER_SYSTEMS: dict[str, tuple[str, type[LoadClient]]] = {
    **{name: (name, BeanstalkClient) for name in ("beanstalkd", "beanstalkd-b", "beanstalkd-b-f0")},
    **{name: (name, RedisClient) for name in ("redis", "redis-aof-everysec", "redis-aof-always")},
    "jetstream-memory": ("jetstream", JetStreamClient),
    "jetstream-file": ("jetstream", JetStreamFileClient),
    "rabbitmq": ("rabbitmq", AMQPClient),
    "rabbitmq-durable": ("rabbitmq", DurableAMQPClient),
    "rabbitmq-quorum": ("rabbitmq", QuorumAMQPClient),
}
#: setups (a storage setup, or a peer system) that keep what they took on disk
DURABLE = {"sqlite", "log-interval", "log-always", "beanstalkd-b", "beanstalkd-b-f0",
           "redis-aof-everysec", "redis-aof-always", "postgres", "jetstream-file",
           "rabbitmq-durable", "rabbitmq-quorum"}
IN_MEMORY = {"memory", "beanstalkd", "redis", "jetstream-memory", "rabbitmq"}
EMQP_SCALE = 0.5
PEER_SCALE = {"beanstalkd-b-f0": 0.02}
MEMORY = {"mqks/memory", "mqks/sqlite", "mqks/log-interval", "beanstalkd", "redis"}
#: a restart with a backlog: the durable setups that keep their files between
#: two starts (``postgres`` gets a new cluster each start) and Redis from its AOF
RESTART = {"mqks/sqlite", "mqks/log-interval", "redis-aof-everysec"}


@dataclass(frozen=True)
class System:
    """One client kind against one server setup."""

    name: str  #: "mqks/memory", "beanstalkd-b-f0", "rabbitmq-quorum", ...
    server: str  #: a key of STORAGES (an mqserver) or of PEERS
    client: type[LoadClient]
    scale: float = 1.0  #: share of N it runs (see ``all_systems``)

    @property
    def peer(self) -> bool:
        return self.server in PEERS

    @property
    def setup(self) -> str:
        """The storage setup ("memory", "log-always") or the peer system's name."""
        return self.name.rsplit("/", 1)[-1]

    @property
    def durable(self) -> bool:
        return self.setup in DURABLE

    @property
    def in_memory(self) -> bool:
        return self.setup in IN_MEMORY


def all_systems(http_scale: float) -> list[System]:
    """Every protocol on every storage setup, then the peers.  HTTP (``--http-scale``;
    its drain, a JSON view per message, runs at about a tenth of MQKS's), eMQP
    (a pyzmq call per message; about 10k msgs/s) and ``beanstalkd -b -f0``
    (an fsync per put) run a share of N so a round stays within seconds;
    rates do not depend on N at these sizes."""
    scale = {"http": http_scale, "emqp": EMQP_SCALE}
    systems = [System(f"{protocol}/{storage}", storage, client, scale.get(protocol, 1.0))
               for storage in STORAGES for protocol, client in PROTOCOLS.items()]
    systems += [System(name, server, client, PEER_SCALE.get(name, 1.0))
                for name, (server, client) in PEER_SYSTEMS.items()]
    return systems


def workload_systems(workload: str, systems: list[System]) -> list[System]:
    """Which systems run ``workload``: W1 everything (it is W3 on a durable
    backend); W1c (W1 with every publish confirmed) the systems whose client
    can have each publish confirmed; W2 the in-memory ones; paced latency
    the in-memory stream protocols; memory MQKS per backend (the fsync mode
    does not change what is kept) and beanstalkd and Redis without
    persistence; restart and restart-crash ``RESTART``."""
    if workload == "w1":
        return systems
    if workload == "w1c":
        return [s for s in systems if s.client.can_confirm_each]
    if workload == "w2":
        return [s for s in systems if s.in_memory]
    if workload == "paced":
        return [s for s in systems if s.in_memory and not s.name.startswith("http")]
    if workload == "memory":
        return [s for s in systems if s.name in MEMORY]
    if workload in ("restart", "restart-crash"):
        return [s for s in systems if s.name in RESTART]
    raise ValueError(workload)
