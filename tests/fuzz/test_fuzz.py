"""Runs every atheris fuzz target for a bounded time and asserts that nothing crashed.

``MQSERVER_FUZZ_SECONDS`` (default 10) is the time per target; each runs in a
subprocess (libFuzzer owns the process) from its seed corpus in
tests/fuzz/corpus/<target>/, writing new inputs to a temporary copy so the
repository's corpus is never changed by a test run.  A crash leaves its
input in the test's temporary directory and fails with atheris' report.
The number of inputs run is printed (``pytest -s``) from libFuzzer's
``#N DONE`` line.  How to run them for hours: docs/operations.md, "Fuzzing".
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("atheris")

HERE = Path(__file__).resolve().parent
TARGETS = ["mqks", "phpmq", "emqp", "http"]
SECONDS = int(os.environ.get("MQSERVER_FUZZ_SECONDS", "10"))
DONE = re.compile(rb"^#(\d+)\s+DONE\s+cov: (\d+)", re.MULTILINE)


@pytest.mark.timeout(SECONDS * 3 + 120)
@pytest.mark.parametrize("target", TARGETS)
def test_fuzz_target_runs_clean(target: str, tmp_path: Path) -> None:
    corpus = tmp_path / "corpus"
    shutil.copytree(HERE / "corpus" / target, corpus)
    result = subprocess.run(
        [
            sys.executable, str(HERE / f"fuzz_{target}.py"),
            f"-max_total_time={SECONDS}", "-rss_limit_mb=1024", "-timeout=30",
            f"-artifact_prefix={tmp_path}/", str(corpus),
        ],
        cwd=HERE, capture_output=True, timeout=SECONDS * 3 + 100,
    )
    output = result.stdout + result.stderr
    crashes = [p.name for p in tmp_path.iterdir() if p.name.startswith(("crash-", "timeout-", "oom-"))]
    assert result.returncode == 0 and not crashes, (
        f"fuzz_{target} failed ({result.returncode}, {crashes}):\n"
        + output[-6000:].decode("utf-8", "replace")
    )
    done = DONE.search(output)
    assert done, output[-2000:].decode("utf-8", "replace")
    runs, coverage = int(done.group(1)), int(done.group(2))
    assert runs > 0
    print(f"fuzz_{target}: {runs} inputs in {SECONDS} s, coverage {coverage}, no crash")
