"""An example third-party storage backend for mqserver: ``--storage=jsonsnap``.

``twisted.plugins`` is listed explicitly (find_packages skips it) and must
never get an ``__init__.py``: Twisted merges every ``twisted/plugins``
directory on sys.path into one package, and an ``__init__.py`` here would
hide Twisted's own.
"""

from setuptools import setup

setup(
    name="mqserver-example-store",
    version="0.1.0",
    description="Example mqserver storage plugin: the broker state as one JSON snapshot",
    license="MIT",
    python_requires=">=3.11",
    packages=["mqserver_example_store", "twisted.plugins"],
    install_requires=["mqserver"],
    extras_require={"test": ["pytest>=8", "pytest-twisted>=1.14"]},
)
