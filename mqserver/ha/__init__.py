"""Active/standby failover on a shared PostgreSQL database (``--ha``; docs/ha.md)."""
