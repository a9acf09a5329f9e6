"""``flowtrace``: analyse router traces (Spark or plain Python), validate them, or synthesise
some.

    flowtrace analyze TRACES... --out REPORT_DIR [--engine auto|spark|local]
                      [--master local[*]] [--bucket SECONDS]
                      [--max-bad-fraction F] [--progress] [...]
    flowtrace validate TRACES... [--max-bad-fraction F]
    flowtrace study --out DIR [--routers 20,40,80] [--flows ...] [--predict ...]
    flowtrace synth --routers N --flows F --out DIR [...]

Exit status: 0 on success (a few bad trace lines are counted and reported), 1 when the job
fails or more than --max-bad-fraction of the lines are bad, 2 for usage errors (bad options,
no trace files), 130 on Ctrl-C.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
from collections import Counter
from collections.abc import Sequence
from typing import Any

from flowrouter import console

EPILOG = """\
TRACES are JSON Lines files written by flowrouter.core.traces.TraceWriter (schema versions
in flowtrace.schema; see the README): files, directories (searched recursively for *.jsonl
and *.jsonl.gz), shell-style globs, or any Hadoop-compatible URI (hdfs://, s3a://, ...), which
Spark reads as is (s3a:// needs the hadoop-aws package: see the README). Time buckets are
[k*SECONDS, (k+1)*SECONDS) of the routers' clocks; rates divide by the seconds of each bucket
the run covers. Peaks are exact (every snapshot and entry event, not one snapshot per
bucket) and named by run, router and time.

Outputs under REPORT_DIR: report.md and report.html (with plots/*.png), summary.json, and
Parquet tables under tables/ (errors, clock_offsets, clock_outliers, routers, router_buckets,
network_buckets, role_entries, churn, gc_lag, gc_lag_summary, gc_lag_hist, savings,
load_by_role, load_summary, fanout, flows, tree_size, run_points, fit), partitioned by run
(one file per run for the large ones, sorted by router). On a cluster, give --tables-uri on a
shared file system; the report itself is always written on the driver.

Engines: --engine auto (the default) analyses local inputs of at most --local-limit bytes
(64 MiB, about 450,000 lines) in plain Python, with no JVM (a small trace takes about a
second instead of a minute), and everything else with Spark; --engine local / spark choose
outright. Both write the same tables, summary and report (tests/test_flowtrace_engines.py
compares them), which name the engine that ran; the local engine holds the whole trace in
memory, writes Parquet with pyarrow and ignores the Spark-only options (--master,
--driver-memory, --shuffle-partitions, --conf, --ui). With Spark, local inputs of at most
8 MiB run with adaptive execution and whole-stage code generation off and one shuffle
partition (their fixed costs dominate a small job); larger inputs use the session's
settings.
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


def _bad_fraction_option(p: argparse.ArgumentParser, default: float = 0.01) -> None:
    p.add_argument("--max-bad-fraction", type=float, default=default, metavar="F",
                   help=f"fail (exit 1) when more than this fraction of the lines are corrupt "
                        f"or invalid (default {default:g})")


def build_parser() -> argparse.ArgumentParser:
    parser = console.ArgumentParser(
        prog="flowtrace", description="Mine flownet router traces for flow-table scaling.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    a = sub.add_parser(
        "analyze", help="analyse traces and write tables and the report",
        description="Analyse TRACES (with Spark, or in plain Python for a small local "
                    "input: --engine) and write tables, report and plots.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    a.add_argument("traces", nargs="+", metavar="TRACES",
                   help="trace files, directories, globs or Hadoop-compatible URIs")
    a.add_argument("--out", "-o", required=True, metavar="REPORT_DIR",
                   help="directory for report.md/report.html, plots/, summary.json and "
                        "tables/ (created; existing tables are overwritten)")
    a.add_argument("--engine", choices=("auto", "spark", "local"), default="auto",
                   help="auto (default): the local engine for local inputs of at most "
                        "--local-limit bytes (with a local master, local tables and pyarrow "
                        "installed), else Spark; spark: the PySpark job; local: the same "
                        "tables and report in plain Python, no JVM (the whole trace is held "
                        "in memory). The report and summary.json say which ran")
    a.add_argument("--local-limit", type=_size, default=None, metavar="SIZE",
                   help="the largest input (bytes; k, M, G suffixes) --engine auto runs "
                        "locally (default 64M, about 450,000 lines; the local engine holds "
                        "about 1.5 KB a line in memory; 0: always Spark)")
    a.add_argument("--master", default="local[*]", metavar="URL",
                   help="Spark master: local[*] (default: embedded, all cores), local[N], "
                        "spark://host:7077, yarn, k8s://...")
    a.add_argument("--bucket", type=_positive, default=None, metavar="SECONDS",
                   help="width of the time buckets in seconds (default: a round width giving "
                        "about 50 buckets over the traces' span); widened (with a note) if "
                        "the traces would need more than 20000 buckets")
    _bad_fraction_option(a)
    a.add_argument("--clock-fence", type=float, default=10.0, metavar="K",
                   help="leave out records more than K times the run's 5th..95th percentile "
                        "time range outside it (a router with a wrong clock); counted per "
                        "router in the clock_outliers table (default 10; 0: keep all)")
    a.add_argument("--clock-tolerance", type=float, default=1.0, metavar="SECONDS",
                   help="estimate each router's clock offset from the links seen coming up "
                        "on both ends; leave out (and name) a router whose clock is more than "
                        "SECONDS off the majority of the routers it connects to; offsets in "
                        "the clock_offsets table (default 1; 0: do not check)")
    a.add_argument("--driver-host", default="127.0.0.1", metavar="ADDRESS",
                   help="address the Spark driver binds to and advertises (default "
                        "127.0.0.1; a cluster whose executors run on other machines needs "
                        "one they can reach)")
    a.add_argument("--ui", action="store_true",
                   help="start Spark's web UI (off by default; it binds to --driver-host)")
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
        "validate", help="check trace files against the schema",
        description="Count valid records, corrupt lines and schema violations by reason, with "
                    "the line rule and reasons of analyze (flowtrace.schema). Local files "
                    "are checked in Python; URIs (hdfs://, s3a://) with Spark. Exit status 0 "
                    "when the bad lines are at most --max-bad-fraction of all, 1 otherwise.")
    v.add_argument("traces", nargs="+", metavar="TRACES",
                   help="trace files, directories, globs or Hadoop-compatible URIs")
    _bad_fraction_option(v, default=0.0)
    v.add_argument("--master", default="local[*]", metavar="URL",
                   help="Spark master for URIs (default local[*])")
    v.add_argument("--conf", type=_conf, action="append", default=[], metavar="KEY=VALUE",
                   help="extra Spark configuration for URIs; repeatable")
    v.add_argument("--show", type=int, default=5, metavar="N",
                   help="print the first N bad lines with file and line number (default 5)")

    st = sub.add_parser(
        "study", help="scaling study on the simulator, fitted across runs",
        description="Run the simulator over a grid of network sizes, flow counts and members "
                    "per flow (several seeds each), fit table size per router role across "
                    "runs with confidence intervals and held-out error, and predict only "
                    "inside the range the runs support (see flowtrace.study).")
    from . import study

    study.add_arguments(st)

    s = sub.add_parser(
        "synth", help="generate synthetic traces for scale tests",
        description="Generate plausible traces of N routers and F flows (see "
                    "flowtrace.synth).")
    from . import synth_cli

    synth_cli.add_arguments(s)
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


def _size(text: str) -> int:
    """A byte count: 4096, 512k, 32M, 1G (powers of 1024)."""
    units = {"": 1, "k": 2**10, "m": 2**20, "g": 2**30}
    t = text.strip().lower().removesuffix("b").removesuffix("i")
    unit = t[-1:] if t[-1:] in units else ""
    try:
        value = float(t[:len(t) - len(unit)]) * units[unit]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a size: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must not be negative: {text!r}")
    return int(value)


def cmd_analyze(args: argparse.Namespace) -> int:
    from . import job, session

    try:
        paths = session.resolve_inputs(args.traces)
    except FileNotFoundError as exc:
        _eprint(f"flowtrace: {exc}")
        return 2
    if not 0 <= args.max_bad_fraction <= 1:
        _eprint("flowtrace: --max-bad-fraction must be between 0 and 1")
        return 2
    engine, why = job.choose_engine(args.engine, paths, master=args.master,
                                    tables_uri=args.tables_uri,
                                    limit=job.LOCAL_LIMIT if args.local_limit is None
                                    else args.local_limit)
    emit = _eprint if args.progress else None
    if emit:
        emit(f"[flowtrace] engine {engine} ({why})")
    progress = job.Progress(emit)
    config = {"engine_choice": why, "master": args.master,
              "shuffle_partitions": args.shuffle_partitions,
              "driver_memory": args.driver_memory}
    kwargs = dict(bucket=args.bucket, progress=progress, tables_uri=args.tables_uri,
                  top_routers=args.top, make_report=not args.no_report,
                  max_bad_fraction=args.max_bad_fraction, clock_fence=args.clock_fence,
                  clock_tolerance=args.clock_tolerance, config=config, engine=engine)
    if engine == "local":
        if any(session.is_uri(p) for p in paths):
            _eprint("flowtrace: the local engine reads local files only; use --engine spark "
                    "for URIs")
            return 2
        try:
            import pyarrow  # noqa: F401
        except ImportError:
            _eprint("flowtrace: the local engine writes Parquet with pyarrow, which is not "
                    "installed (pip install pyarrow), or use --engine spark")
            return 1
        return _run_job(args, None, kwargs)
    try:
        from pyspark.sql import SparkSession
    except ImportError:
        _eprint("flowtrace: pyspark is not installed (pip install pyspark; Java 17+ needed)")
        return 1
    had_session = SparkSession.getActiveSession() is not None
    if emit:
        emit(f"[flowtrace] starting Spark ({args.master})")
    try:
        spark = session.build_session(
            args.master, driver_memory=args.driver_memory,
            shuffle_partitions=args.shuffle_partitions, conf=args.conf,
            driver_host=args.driver_host, ui=args.ui)
    except Exception as exc:  # noqa: BLE001 - one line, not a JVM trace
        _eprint(f"flowtrace: {session.one_line_error(exc)}")
        return 1
    try:
        return _run_job(args, spark, kwargs)
    finally:
        if not had_session:
            spark.stop()


def _run_job(args: argparse.Namespace, spark: Any, kwargs: dict[str, Any]) -> int:
    """Run the analysis on *spark* (None: the local engine) and print its summary."""
    import json

    from . import job, report, session

    with session.noting_interrupts() as interrupted:
        try:
            if spark is not None and args.progress:
                with _StatusPoller(spark, _eprint):
                    result = job.analyze(spark, args.traces, args.out,
                                         **kwargs)  # type: ignore[arg-type]
            else:
                result = job.analyze(spark, args.traces, args.out,
                                     **kwargs)  # type: ignore[arg-type]
        except job.BadInput as exc:
            _eprint(f"flowtrace: bad input: {exc}")
            return 1
        except Exception as exc:  # noqa: BLE001 - report, don't dump a JVM trace on users
            if interrupted:  # a Ctrl-C that py4j reported as a gateway error
                raise KeyboardInterrupt from None
            _eprint(f"flowtrace: the analysis failed: {session.one_line_error(exc)}")
            return 1
    if args.json:
        print(json.dumps(result.summary, indent=2, sort_keys=True, default=str))
    else:
        print(report.console_summary(result.summary))
        if result.report_md:
            print(f"  report: {result.report_md} (and {result.report_html})")
    return 0


def _validate_spark(args: argparse.Namespace) -> tuple[Counter[str], Counter[tuple[str, str]]]:
    """Count kinds and (class, reason) with Spark (for URIs), by the same rules."""
    from . import schema, session

    spark = session.build_session(args.master, shuffle_partitions=2, conf=args.conf)
    rows = (schema.read_records(spark, session.resolve_inputs(args.traces))
            .groupBy("err", "kind").count().collect())
    kinds: Counter[str] = Counter()
    errors: Counter[tuple[str, str]] = Counter()
    for r in rows:
        if r["err"] is None:
            kinds[r["kind"]] += r["count"]
        else:
            errors[(schema.error_class(r["err"]) or "invalid", r["err"])] += r["count"]
    return kinds, errors


def cmd_validate(args: argparse.Namespace) -> int:
    from . import schema, session

    kinds: Counter[str] = Counter()
    errors: Counter[tuple[str, str]] = Counter()
    if any(session.is_uri(t) and not t.startswith("file://") for t in args.traces):
        try:
            kinds, errors = _validate_spark(args)
        except FileNotFoundError as exc:
            _eprint(f"flowtrace: {exc}")
            return 2
        except Exception as exc:  # noqa: BLE001 - one line, not a JVM trace
            _eprint(f"flowtrace: {session.one_line_error(exc)}")
            return 1
    else:
        shown = 0
        try:
            for path, n, text, rec, bad in schema.check_files(
                    [t[len("file://"):] if t.startswith("file://") else t for t in args.traces]):
                if bad is None:
                    kinds[rec["kind"] if rec else "?"] += 1
                    continue
                errors[bad] += 1
                if shown < args.show:
                    shown += 1
                    print(f"{path}:{n}: {bad[0]}: {bad[1]}: {text[:120]}")
        except FileNotFoundError as exc:
            _eprint(f"flowtrace: {exc}")
            return 2
    lines = sum(kinds.values()) + sum(errors.values())
    bad_n = sum(errors.values())
    print(f"{sum(kinds.values())} valid records "
          f"({', '.join(f'{k} {n}' for k, n in sorted(kinds.items()))}); "
          f"{sum(n for (k, _), n in errors.items() if k == 'corrupt')} corrupt lines; "
          f"{sum(n for (k, _), n in errors.items() if k == 'invalid')} schema violations")
    for (kind, reason), n in errors.most_common():
        print(f"  {kind}: {reason}: {n}")
    if lines == 0:
        _eprint("flowtrace: no records at all")
        return 1
    return 1 if bad_n / lines > args.max_bad_fraction else 0


def main(argv: Sequence[str] | None = None) -> int:
    """The ``flowtrace`` console script (errors and exit codes: flowrouter.console)."""
    return console.run("flowtrace", _main, list(sys.argv[1:] if argv is None else argv))


def _main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    try:
        if args.command == "analyze":
            return cmd_analyze(args)
        if args.command == "validate":
            return cmd_validate(args)
        if args.command == "study":
            from . import study

            return study.run(args, _eprint)
        from . import synth_cli

        return synth_cli.run(args)
    except KeyboardInterrupt:
        _eprint("flowtrace: interrupted")
        return 130
    except BrokenPipeError:
        # the reader went away (flowtrace ... | head): stop quietly
        try:
            sys.stdout = open(os.devnull, "w")  # noqa: SIM115
        except OSError:
            pass
        return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
