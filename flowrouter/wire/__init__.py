"""The wire format every flownet party speaks: FlowIDs, bands, the 24-byte header, control
messages, link authentication records, capabilities and addresses.

Imports nothing else of flownet and does no I/O (no asyncio, socket or threading): routers,
flowlib, the simulator and tools all build on it.
"""
