"""The broker event journal: JSON lines in rolling segments (see docs/analytics.md).

``schema`` is pure Python and shared with the analytics pipeline; ``encode``
turns captured event tuples into lines; ``writer`` is the Twisted service
that buffers, flushes and seals segments.
"""
