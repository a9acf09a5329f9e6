"""flownet's directory service (after Warfield, Flows (UBC MSc thesis, 2001), section 5.1).
Built on flowlib; may import flowlib and flowrouter.wire only.

The directory is a flow that directory members join: a well-known flow per location service,
``FlowID(0xD1EC7044, LSID, 0)``. Its entries are tuples ``(name, FlowID, kind, *attrs)`` with
an owner and an expiry; owners refresh them, members drop them when they run out. Queries are
tuples with wildcards plus a reply flow, sent with a growing reach (expanding-ring search)
so the nearest member that knows the answer is found first.

* :class:`DirectoryMember` - the role that stores entries and answers queries (embed it in
  an application, or run ``flowdir serve``);
* :class:`DirectoryClient` - register, lookup, list, remove; :class:`Watcher`
  (:mod:`flowdir.watch`) - follow changes;
* :mod:`flowdir.protocol` - the flow, bands and wire messages; :mod:`flowdir.entries` -
  the tuple and pattern types they carry;
* ``flowdir`` (:mod:`flowdir.cli`) - the same from a shell.
"""

from .client import (
                     Change,
                     DirectoryClient,
                     DirectoryError,
                     LookupResult,
                     Match,
                     NoDirectoryMember,
                     QueryRejected,
                     Registration,
                     Watcher,
)
from .member import DirectoryMember, EntryStore
from .protocol import (
                     BAND_QUERY,
                     BAND_REGISTER,
                     BAND_REMOVE,
                     BAND_REPLY,
                     DIRECTORY_CREATOR,
                     KIND_FLOW,
                     KIND_LS,
                     Entry,
                     Pattern,
                     ProtocolError,
                     Reach,
                     directory_flow,
                     expanding_rings,
                     glob_match,
)

__all__ = [
    "DirectoryClient", "DirectoryMember", "EntryStore", "Change", "LookupResult", "Match",
    "Registration", "Watcher", "DirectoryError", "NoDirectoryMember", "QueryRejected",
    "Entry", "Pattern", "ProtocolError", "Reach", "directory_flow", "expanding_rings",
    "glob_match", "DIRECTORY_CREATOR", "KIND_FLOW", "KIND_LS", "BAND_REGISTER", "BAND_REMOVE",
    "BAND_QUERY", "BAND_REPLY",
]
