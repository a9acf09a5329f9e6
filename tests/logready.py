"""A router process started by a test, its log lines copied to a file as they come, and an
event for the line that says it is up: a test awaits that line instead of polling a port.

``flowrouter -v run`` logs ``router NAME running (...)`` once its listeners, control port
and HTTP monitoring are all up (flowrouter.tools.cli.run_node)."""

from __future__ import annotations

import subprocess
import threading
from pathlib import Path

RUNNING = " running ("


class LoggedProcess:
    """*argv* with its stderr (and stdout) pumped into *log*; :meth:`wait_ready` returns
    once a line holding *ready* came, or the process ended first (then False)."""

    def __init__(self, argv: list[str], env: dict[str, str], cwd: Path, log: Path,
                 ready: str = RUNNING) -> None:
        self.log = log
        self.ready = False
        self._seen = threading.Event()
        self.proc = subprocess.Popen(argv, env=env, cwd=cwd, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True)
        threading.Thread(target=self._pump, args=(ready,), daemon=True).start()

    def _pump(self, ready: str) -> None:
        assert self.proc.stdout is not None
        with self.log.open("w") as out:
            for line in self.proc.stdout:
                out.write(line)
                out.flush()
                if not self.ready and ready in line:
                    self.ready = True
                    self._seen.set()
        self._seen.set()  # it ended: no such line will come

    def wait_ready(self, timeout: float = 60.0) -> bool:
        self._seen.wait(timeout)
        return self.ready

    def text(self) -> str:
        return self.log.read_text(errors="replace")
