"""Starting Spark for flowtrace, finding its inputs, and turning remote failures into one line.

Holds :func:`build_session` (a SparkSession bound to the loopback address with its web UI off
unless asked, the JVM's start-up chatter kept out of the terminal), :func:`resolve_inputs`
(local paths and Hadoop URIs), and :func:`one_line_error` (a JVM failure, such as an
unreachable ``hdfs://`` name node or a missing ``s3a`` file system, as one readable line).
Py4J's own error reports (tracebacks it logs on the root logger, e.g. for every call a Ctrl-C
interrupts) are kept off the terminal while flowtrace runs (:func:`quiet_py4j`).
Imports only the standard library, :mod:`flowrouter.core.traces` and, lazily, pyspark.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import signal
import tempfile
import threading
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from flowrouter.core import traces as TR

#: the address the driver binds to and advertises unless told otherwise
LOOPBACK = "127.0.0.1"


def build_session(master: str = "local[*]", *, app_name: str = "flowtrace",
                  driver_memory: str | None = None, shuffle_partitions: int | None = None,
                  conf: Iterable[tuple[str, str]] = (), driver_host: str = LOOPBACK,
                  ui: bool = False) -> Any:
    """A SparkSession for the job (reuses an active one, e.g. the tests').

    The driver binds to and advertises *driver_host* (loopback by default: nothing listens on
    the machine's external addresses; a cluster whose executors run elsewhere needs the
    address they can reach). The web UI is off unless *ui*. When this call starts the JVM,
    its standard error (log4j's start-up lines, JVM warnings) goes to a file named in
    ``spark.flowtrace.log`` of the session's conf; it is printed only if the start fails.
    """
    from pyspark.sql import SparkSession

    os.environ.setdefault("SPARK_LOCAL_IP", driver_host)
    builder = SparkSession.builder.master(master).appName(app_name)
    builder = builder.config("spark.ui.showConsoleProgress", "false")
    builder = builder.config("spark.ui.enabled", "true" if ui else "false")
    builder = builder.config("spark.driver.host", driver_host)
    builder = builder.config("spark.driver.bindAddress",
                             driver_host if driver_host == LOOPBACK else "0.0.0.0")
    # traces come as many small files (one per router, rotated): list them on the driver
    # (not as a Spark job with a task per path) and pack several into one read partition
    builder = builder.config("spark.sql.sources.parallelPartitionDiscovery.threshold", "100000")
    builder = builder.config("spark.sql.files.openCostInBytes", str(2**20))
    local = master.startswith("local")
    if driver_memory is None and local:
        driver_memory = default_driver_memory()
    if local:
        # smaller input splits: more, lighter tasks for the embedded single JVM
        builder = builder.config("spark.sql.files.maxPartitionBytes", str(32 * 2**20))
    if driver_memory:
        builder = builder.config("spark.driver.memory", driver_memory)
    if shuffle_partitions is None and local:
        shuffle_partitions = 8
    if shuffle_partitions:
        builder = builder.config("spark.sql.shuffle.partitions", str(shuffle_partitions))
    for k, v in conf:
        builder = builder.config(k, v)
    quiet_py4j()
    if SparkSession.getActiveSession() is not None:
        spark = builder.getOrCreate()
    else:
        spark = _start_quietly(builder)
    spark.sparkContext.setLogLevel("ERROR")
    return spark


class _NotFromPy4J(logging.Filter):
    """Drops records py4j logs on the root logger: it reports every gateway call a Ctrl-C
    or a dying JVM cut short with a traceback there, while flowtrace says what happened in
    one line of its own."""

    def filter(self, record: logging.LogRecord) -> bool:
        return f"{os.sep}py4j{os.sep}" not in record.pathname


_PY4J_FILTER = _NotFromPy4J()


def quiet_py4j() -> None:
    """Keep py4j's tracebacks off the terminal (``FLOWNET_TRACEBACK=1`` keeps them).

    Two doors: records py4j logs on the root logger (the filter), and records of its own
    loggers (``py4j.clientserver``, ``py4j.java_gateway``), which propagate to the root's
    handlers without passing the root logger's filters: the ``py4j`` logger stops them."""
    if os.environ.get("FLOWNET_TRACEBACK") != "1":
        logging.getLogger().addFilter(_PY4J_FILTER)  # the same filter once, however often
        py4j = logging.getLogger("py4j")
        py4j.setLevel(logging.CRITICAL + 1)
        py4j.propagate = False


def _start_quietly(builder: Any) -> Any:
    """Start the JVM with its stderr in a log file (the JVM keeps that descriptor)."""
    log = tempfile.NamedTemporaryFile(prefix="flowtrace-spark-", suffix=".log",  # noqa: SIM115
                                      delete=False)
    saved = os.dup(2)
    try:
        os.dup2(log.fileno(), 2)
        try:
            with _interrupt_after_start() as interrupted:
                spark = builder.config("spark.flowtrace.log", log.name).getOrCreate()
            if interrupted:
                spark.stop()
                raise KeyboardInterrupt
        finally:
            os.dup2(saved, 2)
    except Exception as exc:
        log.flush()
        with open(log.name, encoding="utf-8", errors="replace") as fh:
            tail = fh.read()[-2000:]
        raise RuntimeError(f"Spark did not start ({one_line_error(exc)}); its output, from "
                           f"{log.name}:\n{tail}") from None
    finally:
        os.close(saved)
        log.close()
    return spark


@contextlib.contextmanager
def _interrupt_after_start() -> Iterator[list[int]]:
    """Hold a first Ctrl-C while the JVM starts (the list it yields is then non-empty).

    The JVM ignores SIGINT (pyspark starts it so); a KeyboardInterrupt raised in the middle
    of its start would leave it running with nobody to stop it. A second Ctrl-C is not
    held. Outside the main thread signals cannot be handled, and nothing changes.
    """
    got: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield got
        return

    def held(signum: int, frame: Any) -> None:
        got.append(signum)
        signal.signal(signal.SIGINT, previous)

    previous = signal.signal(signal.SIGINT, held)
    try:
        yield got
    finally:
        if not got:
            signal.signal(signal.SIGINT, previous)


@contextlib.contextmanager
def noting_interrupts() -> Iterator[list[int]]:
    """Note every Ctrl-C (the list it yields is then non-empty) and raise KeyboardInterrupt as
    usual. py4j turns a KeyboardInterrupt that lands inside a gateway call into its own error
    ("Answer from Java side is empty"), so the caller asks this list, not the exception's type,
    whether the user interrupted. Outside the main thread nothing changes."""
    got: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield got
        return

    def noted(signum: int, frame: Any) -> None:
        got.append(signum)
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGINT, noted)
    try:
        yield got
    finally:
        signal.signal(signal.SIGINT, previous)


def default_driver_memory() -> str:
    """For local mode (the driver is the only executor): 40% of RAM, 1-16 GiB."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # pragma: no cover - not POSIX
        return "2g"
    return f"{max(1, min(16, int(total * 0.4 / 2**30)))}g"


def is_uri(item: str) -> bool:
    """A Hadoop-style URI (``hdfs://``, ``s3a://``...) rather than a local path."""
    return re.match(r"[A-Za-z][A-Za-z0-9+.-]*://", item) is not None


def resolve_inputs(inputs: Sequence[str]) -> list[str]:
    """Local files/dirs/globs -> files (via :func:`flowrouter.core.traces.expand_paths`);
    URIs with a scheme other than ``file:`` are passed to Spark unchanged (globs and dirs work
    there too)."""
    out: list[str] = []
    for item in inputs:
        if is_uri(item) and not item.startswith("file://"):
            out.append(item)
            continue
        local = item[len("file://"):] if item.startswith("file://") else item
        out += [os.path.abspath(p) for p in TR.expand_paths(local)]
    if not out:
        raise FileNotFoundError("no trace files found in " + ", ".join(inputs))
    return out


#: JVM exception classes -> what to tell the user
_HINTS = (
    ("S3AFileSystem not found",
     "s3a:// needs the hadoop-aws jar matching Spark's Hadoop (see README: flowtrace on S3), "
     "e.g. --conf spark.jars.packages=org.apache.hadoop:hadoop-aws:3.4.1"),
    ("No FileSystem for scheme", "no Hadoop file system is installed for this URI scheme"),
    ("UnknownHostException", "unknown host"),
    ("ConnectException", "connection refused"),
    ("AccessDenied", "access denied"),
    ("PATH_NOT_FOUND", "path does not exist"),
    ("FileNotFoundException", "path does not exist"),
)


def one_line_error(exc: BaseException) -> str:
    """A Spark/JVM failure as one line: the innermost Java exception and a hint, without the
    stack trace (a Py4J error carries ~175 lines of it)."""
    text = str(exc)
    hint = next((h for key, h in _HINTS if key in text), None)
    # the most specific "java.x.y.SomeException: message" line, else the first line
    causes = re.findall(r"((?:[a-z0-9_]+\.)+[A-Za-z0-9_$]*(?:Exception|Error)[^\n]*)", text)
    first = next((ln.strip() for ln in text.splitlines() if ln.strip()), type(exc).__name__)
    detail = causes[-1].strip() if causes else first
    if first.startswith("[") and not causes:  # Spark's own error classes: [PATH_NOT_FOUND] ...
        detail = first
    detail = re.sub(r"\s+", " ", detail)[:300]
    return f"{detail} ({hint})" if hint else detail
