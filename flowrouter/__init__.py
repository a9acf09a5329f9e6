"""flownet's flow router, in layers (each may import only the ones below it):

``tools`` (CLI) > ``testbed`` (topologies, launcher, simulator) > ``net`` (asyncio shell)
> ``core`` (sans-I/O router) > ``wire`` (protocol formats). ``import-linter`` enforces it,
and that flowrouter imports nothing above it: flowlib and the applications build on ``wire``,
and what runs applications over routers (``flowrouter demo``, ``flowrouter up``) is flownet's.
"""

__version__ = "0.1.0"  #: the one place the version is written (pyproject reads it)
