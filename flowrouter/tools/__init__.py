"""The edge: the ``flowrouter`` command line and operator tools (the Scapy dissector).

May import every other layer; nothing imports it.
"""
