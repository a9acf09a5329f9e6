"""flowtrace: mine flownet router traces for flow-table scaling (PySpark), and study scaling
on the simulator.

* :mod:`apps.flowtrace.cli` — the ``flowtrace`` command (``main(argv)``);
* :mod:`apps.flowtrace.job` — ``analyze``: read, check, tabulate, fit, report;
* :mod:`apps.flowtrace.tables` — the Python API: DataFrames in, DataFrames out;
* :mod:`apps.flowtrace.schema` — versions, the line rule, the reasons, Spark's reader;
* :mod:`apps.flowtrace.session` — a loopback SparkSession, inputs, one-line JVM errors;
* :mod:`apps.flowtrace.fit` — fits across runs with intervals, held-out error, refusals;
* :mod:`apps.flowtrace.study` / :mod:`~apps.flowtrace.study_report` — ``flowtrace study``;
* :mod:`apps.flowtrace.report` / :mod:`~apps.flowtrace.provenance` — report, plots, header;
* :mod:`apps.flowtrace.synth` / :mod:`~apps.flowtrace.synth_cli` — synthetic traces.

The record schema and the writers live in :mod:`flowrouter.core.traces`. May import
flowrouter.core.traces and flowrouter.testbed.sim (the study), never the router's network
shell.
"""
