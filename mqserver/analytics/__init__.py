"""``mqserver-analytics``: PySpark reports over the broker's event journal.

Needs the ``analytics`` extra (pyspark, pyarrow); the server never
imports this package.  See docs/analytics.md.
"""
