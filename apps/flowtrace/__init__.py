"""flowtrace: mine flownet router traces for flow-table scaling (PySpark).

* :mod:`apps.flowtrace.job` — the Spark job (:func:`~apps.flowtrace.job.analyze`);
* :mod:`apps.flowtrace.report` — Markdown/HTML report and PNG plots;
* :mod:`apps.flowtrace.synth` — synthetic traces for scale tests;
* :mod:`apps.flowtrace.cli` — the ``flowtrace`` command (``main(argv)``).

The record schema and the writers live in :mod:`flowrouter.core.traces`.
"""
