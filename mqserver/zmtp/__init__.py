"""ZMTP 3.0/3.1 (ZeroMQ's wire protocol) spoken in Twisted, without libzmq.

``codec`` holds the pure wire format (greeting, commands, frames and their
limits); ``router`` gives a ``Factory`` with ROUTER-socket semantics that
any protocol riding on ZeroMQ DEALER peers can use (eMQP is the first).
"""
