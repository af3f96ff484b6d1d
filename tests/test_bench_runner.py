"""The bench runner: W1c right after W1, system by system; idle servers stopped."""

from __future__ import annotations

from bench.clients.mqks import MQKSClient
from bench.clients.redis import RedisClient
from bench.runner import Fleet, interleaved, passes
from bench.systems import System


def test_w1_and_w1c_are_one_pass_wherever_they_are_asked():
    assert passes(("w1", "w2", "w1c", "memory")) == [("w1", "w1c"), ("w2",), ("memory",)]
    assert passes(("w1c", "paced", "w1")) == [("paced",), ("w1", "w1c")]
    assert passes(("w1c",)) == [("w1c",)]
    assert passes(("w1",)) == [("w1",)]


def test_a_systems_w1c_round_follows_its_w1_round():
    mqks = System("mqks/memory", "memory", MQKSClient)
    redis = System("redis", "redis", RedisClient)
    phpmq_like = System("phpmq/memory", "memory", MQKSClient)
    chosen = {"w1": [mqks, phpmq_like, redis], "w1c": [mqks, redis]}
    assert interleaved(chosen) == [(mqks, "w1"), (mqks, "w1c"), (phpmq_like, "w1"),
                                   (redis, "w1"), (redis, "w1c")]


class Stoppable:
    stopped = False

    def stop(self) -> None:
        self.stopped = True


def test_the_fleet_stops_the_servers_no_later_workload_uses(tmp_path):
    fleet = Fleet(tmp_path)
    used, idle = Stoppable(), Stoppable()
    fleet.servers = {"memory": used, "rabbitmq": idle}
    fleet.keep_only({"memory", "redis"})
    assert fleet.servers == {"memory": used}
    assert idle.stopped and not used.stopped
