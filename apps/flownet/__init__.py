"""flownet: the tools that run routers and applications together.

The ``flowrouter`` console script is :func:`flownet.cli.main`: the commands of
:mod:`flowrouter.tools.cli` (run, status, check-config, ctl, keygen, sim) plus two that carry
application traffic over routers, and so need flowlib:

* :mod:`flownet.demo` - ``flowrouter demo``: three routers in this process, a sender and two
  receivers with different band masks;
* :mod:`flownet.traffic` - ``flowrouter up``'s applications: a topology's endpoints as flowlib
  clients on one shared flow, over the routers a
  :class:`flowrouter.testbed.launcher.Launcher` runs as processes;
* :mod:`flownet.cli` - the parsers and runners of those two commands.

It sits above both flowrouter and flowlib, so that flowrouter never imports flowlib (flowlib
imports flowrouter.wire). May import flowrouter and flowlib; nothing in the project imports it.
"""
