"""Free loopback ports for tests that must name ports up front (topology files, configs):
below the kernel's ephemeral range, so that no connection is given one before the process
meant to listen on it binds it (:mod:`flowrouter.testbed.ports` says why)."""

from __future__ import annotations

from flowrouter.testbed.ports import free_port, free_port_block

__all__ = ["free_port", "free_port_block"]
