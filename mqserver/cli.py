# -*- test-case-name: tests.integration.test_cli -*-
"""``mqserver``: the broker in the foreground, without typing ``twistd -n``.

``mqserver [OPTIONS]`` is ``twistd -n --pidfile= mqserver [OPTIONS]``: every
option of ``twistd mqserver --help`` works, ``--version`` included, so the
two commands can never disagree.  For daemonising, pid files and log files,
use ``twistd`` itself.
"""

from __future__ import annotations

import sys

from twisted.scripts import twistd


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    sys.argv = ["twistd", "-n", "--pidfile=", "mqserver", *args]
    twistd.run()
