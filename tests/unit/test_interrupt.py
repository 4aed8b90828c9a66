"""A child started under :func:`~pytest_accelperf.interrupt.sigint_delivered` handles SIGINT
even where its parent was started with SIGINT ignored (a shell's background job)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

PARENT = textwrap.dedent("""
    import signal, subprocess, sys
    from pytest_accelperf.interrupt import sigint_delivered
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # as `cmd &` starts it without job control
    child = [sys.executable, "-c",
             "import signal; print(signal.getsignal(signal.SIGINT) is signal.SIG_IGN)"]
    subprocess.run(child, check=True)
    with sigint_delivered():
        subprocess.run(child, check=True)
    print(signal.getsignal(signal.SIGINT) is signal.SIG_IGN)  # the parent's own is restored
""")


def test_the_child_handles_sigint_where_its_parent_ignores_it() -> None:
    out = subprocess.run([sys.executable, "-c", PARENT], capture_output=True, text=True,
                         check=True, timeout=60).stdout.split()
    assert out == ["True", "False", "True"], out
