"""Applications built on flownet (chat, flowtrace).
The top layer: may import directory, flowlib and flowrouter; nothing imports apps.
"""
