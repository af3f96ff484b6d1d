"""Crash-safety harness: ``kill -9`` a real server under load, restart it, check what came back.

Used by ``tests/integration/test_crash.py`` (a few cycles per backend in CI)
and ``python -m bench.crash_soak`` (as many cycles as you like).  It needs an
installed mqserver and pyzmq (the test extra), so a third-party backend can
run it too: ``python -m bench.crash_soak --storage-args="--storage=NAME"``.

Each cycle starts ``twistd -n mqserver`` with MQKS, PHPMQ, eMQP and HTTP on
ephemeral ports and:

1. **checks and drains** what the previous cycle left: one MQKS manual-ack
   consumer per queue takes everything and acks it all;
2. **loads** it with every settle path, through real clients over real
   sockets (``topology.QUEUES`` lists the queues and their options):

   - MQKS (``mqks.py``) publishes ``--confirm`` to ``q``, ``p`` and ``u``,
     and acks, rejects (``--confirm``) or holds what it takes from ``q``,
     ``r`` and ``r0``;
   - HTTP (``http.py``) publishes durably to ``r``, ``r0`` and ``p`` with
     ``x-max-retries`` 0 to 2 (a third of them batches of 2 to 5) and to
     the event of ``t`` and ``t0`` with a TTL of 0.5 or 600 s, and purges
     ``u``;
   - PHPMQ (``phpmq.py``) takes ``p`` and acks (004), requeues with a TTL
     (005) or dead-letters (006);
   - eMQP (``emqp.py``) sends REQUESTs with ``retry-count`` and ``timeout``
     to ``e`` and ``e0``; its worker acks, fails or ignores each;

   ``r``, ``p``, ``t`` and ``e`` have a dead-letter queue, ``r0``, ``t0`` and
   ``e0`` none, so retries run out and TTLs expire both ways;
3. **kills** it with SIGKILL at a random moment of that load.

``ledger.py`` says what must, may and must not come back, and why; how a
settle without a confirm of its own (PHPMQ, eMQP, purge) becomes durable is
in ``mqks.py``, ``phpmq.py`` and ``emqp.py``.  Bodies are derived from ids
and compared byte for byte.

``kill -9`` keeps the kernel's page cache, so every fsync mode must pass
this; what ``--fsync=always`` adds over ``interval`` is survival of a power
cut, which a process kill cannot simulate.
"""

from mqserver.crashtest.harness import CrashCheckError, CrashTest, CycleReport
from mqserver.crashtest.mqks import body_of
from mqserver.crashtest.server import Lines, ServerProcess

__all__ = ["CrashCheckError", "CrashTest", "CycleReport", "Lines", "ServerProcess", "body_of"]
