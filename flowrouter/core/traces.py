"""Router traces in one import: the schema (:mod:`~flowrouter.core.traceschema`), the writers
the core calls (:mod:`~flowrouter.core.tracers`) and the reader
(:mod:`~flowrouter.core.tracereader`). Tools and the Spark job import from here.

Holds no code of its own. May import those three modules.
"""

from __future__ import annotations

from flowrouter.core.tracereader import (
    TraceError,
    expand_paths,
    read_traces,
)
from flowrouter.core.tracers import (
    NULL_TRACER,
    BaseTracer,
    MemoryTrace,
    NullTracer,
    Tracer,
    TraceWriter,
    encode_record,
    snapshot_fields,
)
from flowrouter.core.traceschema import (
    COMMON_FIELDS,
    COMMON_OPTIONAL,
    DIGITS_RE,
    DROP_REASONS,
    ENTRY_BYTES,
    ENTRY_DEL_CAUSES,
    FIELDS,
    FLOW_RE,
    HEX_RE,
    KINDS,
    LINK_ADD_CAUSES,
    LINK_BYTES,
    LINK_DEL_CAUSES,
    ROLES,
    SAMPLED_KINDS,
    SCHEMA_VERSION,
    SPARK_PATTERNS,
    SUPPORTED_VERSIONS,
    TOKEN_RE,
    VERSION_KINDS,
    flow_key_text,
    role_text,
    validate,
)

__all__ = [
    "BaseTracer",
    "COMMON_FIELDS",
    "COMMON_OPTIONAL",
    "DIGITS_RE",
    "DROP_REASONS",
    "ENTRY_BYTES",
    "ENTRY_DEL_CAUSES",
    "FIELDS",
    "FLOW_RE",
    "HEX_RE",
    "KINDS",
    "LINK_ADD_CAUSES",
    "LINK_BYTES",
    "LINK_DEL_CAUSES",
    "MemoryTrace",
    "NULL_TRACER",
    "NullTracer",
    "ROLES",
    "SAMPLED_KINDS",
    "SCHEMA_VERSION",
    "SPARK_PATTERNS",
    "SUPPORTED_VERSIONS",
    "TOKEN_RE",
    "TraceError",
    "TraceWriter",
    "Tracer",
    "VERSION_KINDS",
    "encode_record",
    "expand_paths",
    "flow_key_text",
    "read_traces",
    "role_text",
    "snapshot_fields",
    "validate",
]
