"""flownet's flow router, in layers (each may import only the ones below it):

``tools`` (CLI) > ``testbed`` (topologies, launcher, simulator) > ``net`` (asyncio shell)
> ``core`` (sans-I/O router) > ``wire`` (protocol formats). ``import-linter`` enforces it.
"""

__version__ = "0.1.0"  #: the one place the version is written (pyproject reads it)
