"""flowtrace: mine flownet router traces for flow-table scaling (PySpark), and study scaling
on the simulator.

* :mod:`flowtrace.cli` — the ``flowtrace`` command (``main(argv)``);
* :mod:`flowtrace.job` — ``analyze``: read, check, tabulate, fit, report;
* :mod:`flowtrace.tables` — the Python API: DataFrames in, DataFrames out;
* :mod:`flowtrace.peaks` — exact table peaks (every snapshot and entry event);
* :mod:`flowtrace.clocks` — per-router clock offsets from links seen on both ends;
* :mod:`flowtrace.schema` — versions, the line rule, the reasons, Spark's reader;
* :mod:`flowtrace.session` — a loopback SparkSession, inputs, one-line JVM errors;
* :mod:`flowtrace.fit` — fits across runs with intervals, held-out error, refusals;
* :mod:`flowtrace.study` / :mod:`~flowtrace.study_report` — ``flowtrace study``;
* :mod:`flowtrace.report` / :mod:`~flowtrace.report_plots` / :mod:`~flowtrace.render` /
  :mod:`~flowtrace.provenance` — report, plots, Markdown/HTML, header;
* :mod:`flowtrace.synth` / :mod:`~flowtrace.synth_cli` — synthetic traces.

The record schema and the writers live in :mod:`flowrouter.core.traces`. May import
flowrouter.core.traces and flowrouter.testbed.sim (the study), never the router's network
shell.
"""
