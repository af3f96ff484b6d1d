"""Storage backends: each an ``IMessageStore``, chosen with ``--storage``."""
