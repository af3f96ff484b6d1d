"""Packaging for mqserver.

Packages are listed explicitly: ``find_packages`` would miss
``twisted.plugins`` (which must never get an ``__init__.py``), and without it
``twistd`` cannot find the ``mqserver`` plugin.
"""

import re
from pathlib import Path

from setuptools import setup


def _version() -> str:
    """The one version, ``mqserver.__version__``, read without importing the
    package (its import pulls in Twisted, which a build environment lacks)."""
    text = Path(__file__).with_name("mqserver").joinpath("__init__.py").read_text("utf-8")
    match = re.search(r'^__version__ = "([^"]+)"', text, re.M)
    if match is None:
        raise RuntimeError("no __version__ in mqserver/__init__.py")
    return match.group(1)


setup(
    name="mqserver",
    version=_version(),
    description="A Twisted message broker speaking MQKS, PHPMQ and eMQP over one queue core",
    long_description=Path(__file__).with_name("README.md").read_text(encoding="utf-8"),
    long_description_content_type="text/markdown",
    license="MIT",
    python_requires=">=3.11",
    packages=[
        "mqserver",
        "mqserver.broker",
        "mqserver.crashtest",
        "mqserver.ha",
        "mqserver.storage",
        "mqserver.protocols",
        "mqserver.protocols.mqks",
        "mqserver.protocols.phpmq",
        "mqserver.protocols.emqp",
        "mqserver.zmtp",
        "mqserver.web",
        "mqserver.journal",
        "mqserver.analytics",
        "twisted.plugins",
    ],
    install_requires=[
        # [tls]: pyOpenSSL and service_identity, for ssl: listener endpoints
        "Twisted[tls]>=24.7",
        "zope.interface>=6",
        "sqlite-utils>=3.36",
        "treq>=23.11",
        "prometheus_client>=0.17",
        "croniter>=2",
    ],
    package_data={"mqserver.storage": ["schema/*.sql"], "mqserver.web": ["static/*"]},
    extras_require={
        # --storage=postgres: psycopg 3 with its binary wheel (libpq included)
        "postgres": ["psycopg[binary]>=3.1"],
        # the journal analytics pipeline (mqserver-analytics); ~500 MB of jars
        "analytics": ["pyspark>=4.2,<5", "pyarrow"],
        "test": [
            "pytest>=8",
            "pytest-twisted>=1.14",
            "pytest-timeout>=2.3",
            "hypothesis>=6.100",
            # coverage-guided fuzzing of the protocol parsers (tests/fuzz); a manylinux wheel
            "atheris>=2.3",
            "selenium>=4.10",
            "pyzmq>=25",
            # property-based tests of the served OpenAPI spec (tests/integration)
            "schemathesis>=4",
            "ruff>=0.6",
            "setuptools>=68",
            "wheel",
            "tox>=4",
            "build>=1",
        ],
        # the Sphinx site in docs/ (`make docs`); the test suite builds it too
        "docs": [
            "sphinx>=7",
            "myst-parser>=2",
        ],
    },
    entry_points={"console_scripts": [
        "mqserver = mqserver.cli:main",
        "mqserver-analytics = mqserver.analytics.cli:main",
    ]},
    classifiers=[
        "Framework :: Twisted",
        "Programming Language :: Python :: 3",
        "Topic :: System :: Networking",
    ],
)
