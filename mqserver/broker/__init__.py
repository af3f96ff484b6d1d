"""The queue core: queues, bindings, consumers and timers, shared by every protocol.

Nothing here imports a wire protocol, twisted.web or a storage backend; the
core talks to storage only through ``IMessageStore``.
"""
