"""eMQP, EventMQ's broker dialog, over ZMTP 3 (``mqserver.zmtp``).

``codec`` is the pure frame layer; ``service`` holds the broker-side state
(workers, schedulers, in-flight requests) on top of the shared queue core;
``frontend``, ``backend`` and ``admin`` handle one listening socket each;
``scheduler`` runs SCHEDULEd jobs inside the broker; ``protocol`` wires the
three ROUTER factories for the plugin.
"""
