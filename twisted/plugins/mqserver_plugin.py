"""twistd plugin: ``twistd mqserver``, plus the built-in protocols and backends.

Kept thin so that Twisted's plugin scan imports nothing heavy: ``mqserver.tap``
is imported only when the service is made, and the descriptors re-exported
here import their implementations only when they build one.
"""

from twisted.application.service import ServiceMaker

from mqserver.plugins import emqp, logstore, memory, mqks, phpmq, postgres, sqlite

mqserver = ServiceMaker(
    "mqserver",
    "mqserver.tap",
    "A message broker speaking MQKS, PHPMQ and eMQP over one queue core",
    "mqserver",
)

__all__ = ["emqp", "logstore", "memory", "mqks", "mqserver", "phpmq", "postgres", "sqlite"]
