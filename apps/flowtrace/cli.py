"""``flowtrace``: analyse router traces with Spark, validate them, or synthesise some.

    flowtrace analyze TRACES... --out REPORT_DIR [--master local[*]] [--bucket SECONDS]
                      [--progress] [...]
    flowtrace validate TRACES...
    flowtrace synth --routers N --flows F --out DIR [...]

Exit status: 0 on success (bad trace lines are counted and reported, not fatal), 1 when the
job fails, 2 for usage errors (bad options, no trace files).
"""

from __future__ import annotations

import argparse
import sys
import threading
from collections.abc import Sequence
from typing import Any

EPILOG = """\
TRACES are JSON Lines files written by flowrouter.core.traces.TraceWriter (schema v1; see that
module or the README): files, directories (searched recursively for *.jsonl and *.jsonl.gz),
shell-style globs, or any Hadoop-compatible URI (hdfs://, s3a://, ...), which Spark reads as
is. Time buckets are [k*SECONDS, (k+1)*SECONDS) of the routers' clocks.

Outputs under REPORT_DIR: report.md and report.html (with plots/*.png), summary.json, and
Parquet tables under tables/ (errors, routers, router_buckets, network_buckets, churn, gc_lag,
gc_lag_summary, gc_lag_hist, savings, load_by_role, load_summary, fanout, flows, tree_size,
fit, extrapolation). On a cluster, give --tables-uri on a shared file system; the report
itself is always written on the driver.
"""


def _conf(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key.strip(), value.strip()


def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be positive: {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="flowtrace", description="Mine flownet router traces for flow-table scaling.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    a = sub.add_parser(
        "analyze", help="run the Spark job and write the report",
        description="Run the PySpark job over TRACES and write tables, report and plots.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    a.add_argument("traces", nargs="+", metavar="TRACES",
                   help="trace files, directories, globs or Hadoop-compatible URIs")
    a.add_argument("--out", "-o", required=True, metavar="REPORT_DIR",
                   help="directory for report.md/report.html, plots/, summary.json and "
                        "tables/ (created; existing tables are overwritten)")
    a.add_argument("--master", default="local[*]", metavar="URL",
                   help="Spark master: local[*] (default: embedded, all cores), local[N], "
                        "spark://host:7077, yarn, k8s://...")
    a.add_argument("--bucket", type=_positive, default=60.0, metavar="SECONDS",
                   help="width of the time buckets in seconds (default 60); widened "
                        "automatically (with a note) if the traces would need more than "
                        "20000 buckets")
    a.add_argument("--progress", action="store_true",
                   help="print each stage as it starts and, every few seconds, the running "
                        "Spark stages with their task counts (to stderr)")
    a.add_argument("--driver-memory", metavar="SIZE", default=None,
                   help="spark.driver.memory, e.g. 4g (default in local mode: 40%% of the "
                        "RAM, between 1g and 16g; takes effect only when this process starts "
                        "the JVM)")
    a.add_argument("--shuffle-partitions", type=int, metavar="N", default=None,
                   help="spark.sql.shuffle.partitions (default 8 in local mode, Spark's "
                        "default otherwise)")
    a.add_argument("--conf", type=_conf, action="append", default=[], metavar="KEY=VALUE",
                   help="extra Spark configuration; repeatable")
    a.add_argument("--tables-uri", metavar="URI", default=None,
                   help="where to write the Parquet tables (default REPORT_DIR/tables); use a "
                        "shared file system when the executors are not on this machine")
    a.add_argument("--top", type=int, default=8, metavar="N",
                   help="routers with the largest tables to plot individually (default 8)")
    a.add_argument("--no-report", action="store_true",
                   help="write the tables and summary.json only (no Markdown/HTML/plots)")
    a.add_argument("--json", action="store_true",
                   help="print the summary as JSON instead of the short text summary")

    v = sub.add_parser(
        "validate", help="check trace files against schema v1 (no Spark)",
        description="Read TRACES with flowrouter.core.traces.read_traces and count valid records, "
                    "corrupt lines and schema violations by reason. Exit status 0 when all "
                    "lines are valid, 1 otherwise.")
    v.add_argument("traces", nargs="+", metavar="TRACES",
                   help="trace files, directories or globs (local)")
    v.add_argument("--show", type=int, default=5, metavar="N",
                   help="print the first N bad lines with file and line number (default 5)")

    s = sub.add_parser(
        "synth", help="generate synthetic traces for scale tests",
        description="Generate plausible traces of N routers and F flows (see "
                    "apps.flowtrace.synth).")
    from . import synth

    synth.add_arguments(s)
    return parser


class _StatusPoller:
    """Every *period* seconds, print the running Spark stages and their task counts."""

    def __init__(self, spark: Any, emit: Any, period: float = 5.0) -> None:
        self.tracker = spark.sparkContext.statusTracker()
        self.emit = emit
        self.period = period
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="flowtrace-progress",
                                       daemon=True)

    def _run(self) -> None:
        last, quiet = "", 0.0
        while not self.stop.wait(self.period):
            try:
                parts = []
                for sid in sorted(self.tracker.getActiveStageIds()):
                    info = self.tracker.getStageInfo(sid)
                    if info is not None:
                        parts.append(f"spark stage {sid}: {info.numCompletedTasks}/"
                                     f"{info.numTasks} tasks")
                line = "; ".join(parts)
                quiet += self.period
                # print changes, and the same line again only after a minute
                if line and (line != last or quiet >= 60):
                    self.emit("    " + line)
                    last, quiet = line, 0.0
            except Exception:  # noqa: BLE001 - progress must never break the job
                pass

    def __enter__(self) -> _StatusPoller:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(timeout=1)


def _eprint(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def cmd_analyze(args: argparse.Namespace) -> int:
    import json

    from . import job, report

    try:
        job.resolve_inputs(args.traces)
    except FileNotFoundError as exc:
        _eprint(f"flowtrace: {exc}")
        return 2
    try:
        from pyspark.sql import SparkSession
    except ImportError:
        _eprint("flowtrace: pyspark is not installed (pip install pyspark; Java 17+ needed)")
        return 1
    had_session = SparkSession.getActiveSession() is not None
    emit = _eprint if args.progress else None
    if emit:
        emit(f"[flowtrace] starting Spark ({args.master})")
    spark = job.build_session(args.master, driver_memory=args.driver_memory,
                              shuffle_partitions=args.shuffle_partitions, conf=args.conf)
    progress = job.Progress(emit)
    try:
        if args.progress:
            with _StatusPoller(spark, _eprint):
                result = job.analyze(spark, args.traces, args.out, bucket=args.bucket,
                                     progress=progress, tables_uri=args.tables_uri,
                                     top_routers=args.top, make_report=not args.no_report)
        else:
            result = job.analyze(spark, args.traces, args.out, bucket=args.bucket,
                                 progress=progress, tables_uri=args.tables_uri,
                                 top_routers=args.top, make_report=not args.no_report)
    except Exception as exc:  # noqa: BLE001 - report, don't dump a JVM trace on users
        _eprint(f"flowtrace: the analysis failed: {type(exc).__name__}: {exc}")
        return 1
    finally:
        if not had_session:
            spark.stop()
    if args.json:
        print(json.dumps(result.summary, indent=2, sort_keys=True, default=str))
    else:
        print(report.console_summary(result.summary))
        if result.report_md:
            print(f"  report: {result.report_md} (and {result.report_html})")
    return 0


def cmd_validate(args: argparse.Namespace) -> int:
    from collections import Counter

    from flowrouter.core.traces import TraceError, read_traces

    kinds: Counter[str] = Counter()
    errors: Counter[tuple[str, str]] = Counter()
    shown = 0
    try:
        for item in read_traces(args.traces):
            if isinstance(item, TraceError):
                errors[(item.kind, item.reason)] += 1
                if shown < args.show:
                    shown += 1
                    print(f"{item.path}:{item.line}: {item.kind}: {item.reason}: "
                          f"{item.text[:120]}")
            else:
                kinds[item["kind"]] += 1
    except FileNotFoundError as exc:
        _eprint(f"flowtrace: {exc}")
        return 2
    print(f"{sum(kinds.values())} valid records "
          f"({', '.join(f'{k} {n}' for k, n in sorted(kinds.items()))}); "
          f"{sum(n for (k, _), n in errors.items() if k == 'corrupt')} corrupt lines; "
          f"{sum(n for (k, _), n in errors.items() if k == 'invalid')} schema violations")
    for (kind, reason), n in errors.most_common():
        print(f"  {kind}: {reason}: {n}")
    return 1 if errors else 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    if args.command == "analyze":
        return cmd_analyze(args)
    if args.command == "validate":
        return cmd_validate(args)
    from . import synth

    return synth.run(args)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
