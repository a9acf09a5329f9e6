"""The trace schema as flowtrace reads it: versions, the line rule, reasons, Spark's reader.

One rule and one reason taxonomy serve ``flowtrace validate`` (pure Python, :func:`check_files`)
and ``flowtrace analyze`` (Spark, :func:`read_records`):

* **lines** end at ``\\n`` only; one ``\\r`` before it is dropped; blank lines are skipped;
  invalid UTF-8 is replaced. (A bare ``\\r`` inside a line does not split it.)
* **reasons**: class ``corrupt`` with reason ``not a JSON object``; class ``invalid`` with
  ``unsupported version``, ``missing or invalid field 't'``/``'router'``/``'kind'``,
  ``unknown kind``, ``missing or invalid field 'x'`` (a required field) or ``invalid field 'x'``
  (an optional one), checked in that order.

Versions: every version in :data:`VERSIONS` is read (those
:data:`flowrouter.core.traces.SUPPORTED_VERSIONS` names: v1 with per-flow ``gc_ping`` records,
v2 with per-neighbour ``refresh`` and ``prune`` records), each against its own kinds; the job
works on the union of their fields. Residual difference of Spark's JSON reader: a line holding a
complete object followed by more bytes is read as that object, and a JSON array of objects
on one line as several records; the Python check calls both ``corrupt``.

Imports the standard library, :mod:`flowrouter.core.traces` and, lazily, pyspark.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator, Sequence
from typing import Any

from flowrouter.core import traces as TR

Fields = dict[str, tuple[tuple[tuple[str, str], ...], tuple[tuple[str, str], ...]]]


def _versions() -> dict[int, Fields]:
    """Each version's field table, from the writer's one table and the kinds that exist in
    some versions only (:data:`flowrouter.core.traces.VERSION_KINDS`)."""
    supported = tuple(getattr(TR, "SUPPORTED_VERSIONS", (TR.SCHEMA_VERSION,)))
    only = getattr(TR, "VERSION_KINDS", {})
    return {v: {k: spec for k, spec in TR.FIELDS.items() if v in only.get(k, supported)}
            for v in sorted(supported)}


#: version -> kind -> (required, optional) fields
VERSIONS: dict[int, Fields] = _versions()
KINDS: tuple[str, ...] = tuple(sorted({k for f in VERSIONS.values() for k in f}))

CORRUPT = "not a JSON object"


# ----------------------------------------------------------------------------- Python side
def check(rec: Any) -> str | None:
    """None if *rec* (a parsed JSON value) is a valid record of a supported version, else the
    reason: :func:`flowrouter.core.traces.validate`, whose words the Spark job uses too."""
    return TR.validate(rec)


def iter_lines(path: str) -> Iterator[tuple[int, str]]:
    """(line number, text) of the non-blank lines of one file, by the rule above."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as fh:  # type: ignore[operator]
        for n, raw in enumerate(fh, 1):  # binary files split at b"\n" only
            if raw.endswith(b"\n"):
                raw = raw[:-1]
            if raw.endswith(b"\r"):
                raw = raw[:-1]
            text = raw.decode("utf-8", "replace")
            if text.strip():
                yield n, text


def classify(text: str) -> tuple[str, str] | None:
    """(class, reason) for a bad line, None for a valid record."""
    try:
        rec = json.loads(text)
    except (ValueError, RecursionError):
        return ("corrupt", CORRUPT)
    reason = check(rec)
    if reason is None:
        return None
    return ("corrupt" if reason == CORRUPT else "invalid", reason)


def check_files(paths: Sequence[str]) -> Iterator[tuple[str, int, str, dict[str, Any] | None,
                                                        tuple[str, str] | None]]:
    """(path, line, text, record or None, (class, reason) or None) for every non-blank line."""
    for path in TR.expand_paths(list(paths)):
        for n, text in iter_lines(path):
            bad = classify(text)
            yield path, n, text, (json.loads(text) if bad is None else None), bad


# ----------------------------------------------------------------------------- Spark side
_SPARK_TYPE = {"int": "long", "pos": "long", "band": "long", "num": "double", "str": "string",
               "flow": "string", "token": "string", "hex": "string", "role": "string",
               "bool": "boolean", "fanout": "map<string,bigint>", "ints": "array<bigint>"}


def spark_type(typ: str) -> str:
    """The Spark SQL type of a trace field type (``num`` -> ``double``, ...)."""
    return _SPARK_TYPE[typ]


def all_fields() -> dict[str, str]:
    """Every field of every supported version -> its type (one type per name)."""
    fields: dict[str, str] = {"v": "int"}
    for name, typ in (*TR.COMMON_FIELDS, *TR.COMMON_OPTIONAL):
        fields[name] = typ
    for table in VERSIONS.values():
        for required, optional in table.values():
            for name, typ in (*required, *optional):
                prev = fields.setdefault(name, typ)
                if _SPARK_TYPE[prev] != _SPARK_TYPE[typ]:  # pragma: no cover - sanity
                    raise AssertionError(f"field {name} has two types")
    return fields


def record_schema() -> Any:
    """The explicit Spark schema of a record (plus ``_corrupt_record``)."""
    from pyspark.sql import types as T

    simple = {"long": T.LongType(), "double": T.DoubleType(), "string": T.StringType(),
              "boolean": T.BooleanType(),
              "map<string,bigint>": T.MapType(T.StringType(), T.LongType()),
              "array<bigint>": T.ArrayType(T.LongType())}
    fields = [T.StructField(n, simple[_SPARK_TYPE[t]]) for n, t in all_fields().items()]
    fields.append(T.StructField("_corrupt_record", T.StringType()))
    return T.StructType(fields)


def _q(name: str) -> str:
    return f"`{name}`"


def ok_sql(col: str, typ: str) -> str:
    """Spark SQL twin of ``not traces._bad(value, typ)`` for a non-null value."""
    if typ == "int":
        return f"{col} >= 0"
    if typ == "pos":
        return f"{col} >= 1"
    if typ == "band":
        return f"{col} BETWEEN 0 AND 127"
    if typ == "num":
        return f"abs({col}) < double('Infinity')"  # false for NaN and +-inf
    if typ == "str":
        return f"length({col}) > 0"
    if typ in ("flow", "token", "hex"):
        return f"{col} RLIKE '{TR.SPARK_PATTERNS[typ]}'"
    if typ == "bool":
        return "true"
    if typ == "role":
        return f"{col} IN ({', '.join(repr(r) for r in TR.ROLES)})"
    if typ == "fanout":
        return (f"forall(map_keys({col}), k -> k RLIKE '{TR.SPARK_PATTERNS['digits']}') AND "
                f"forall(map_values({col}), x -> x IS NOT NULL AND x >= 0)")
    if typ == "ints":
        return f"forall({col}, x -> x IS NOT NULL AND x >= 0)"
    raise AssertionError(typ)  # pragma: no cover


def _lit(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def error_sql() -> str:
    """The verdict of :func:`check` as one SQL CASE over the flattened record columns, ``raw``
    (the line as map<string,string>, computed only for lines with a type mismatch) and
    ``_corrupt_record``: null for a valid record, else the reason."""

    def bad(name: str, typ: str) -> str:
        return f"({_q(name)} IS NULL OR NOT ({ok_sql(_q(name), typ)}))"

    def present(name: str) -> str:
        # a value was given (not JSON null), even if it failed to parse as its type
        return f"({_q(name)} IS NOT NULL OR (raw IS NOT NULL AND raw[{_lit(name)}] IS NOT NULL))"

    versions = ", ".join(str(v) for v in VERSIONS)
    arms = [f"WHEN _corrupt_record IS NOT NULL AND raw IS NULL THEN {_lit(CORRUPT)}",
            f"WHEN v IS NULL OR v NOT IN ({versions}) THEN 'unsupported version'"]
    for name, typ in TR.COMMON_FIELDS:
        arms.append(f"WHEN {bad(name, typ)} THEN "
                    + _lit(f"missing or invalid field '{name}'"))
    per_version = []
    for version, table in VERSIONS.items():
        per_kind = []
        for kind, (required, optional) in table.items():
            inner = [f"WHEN {bad(name, typ)} THEN "
                     + _lit(f"missing or invalid field '{name}'") for name, typ in required]
            inner += [f"WHEN {present(name)} AND {bad(name, typ)} THEN "
                      + _lit(f"invalid field '{name}'")
                      for name, typ in (*TR.COMMON_OPTIONAL, *optional)]
            per_kind.append(f"WHEN {_lit(kind)} THEN CASE {' '.join(inner)} END"
                            if inner else f"WHEN {_lit(kind)} THEN NULL")
        per_version.append(f"WHEN {version} THEN CASE kind {' '.join(per_kind)} "
                           "ELSE 'unknown kind' END")
    arms.append(f"ELSE CASE v {' '.join(per_version)} END")
    return "CASE " + " ".join(arms) + " END"


def read_records(spark: Any, paths: Sequence[str]) -> Any:
    """Lines -> one row per non-blank line: every schema field as a column, ``err`` (null
    when valid), and for bad lines their text and file (``line``, ``file``).

    Uses Spark's JSON Lines source with the explicit schema in PERMISSIVE mode (about three
    times faster than ``from_json`` over ``spark.read.text``) and ``lineSep`` ``\\n`` (the line
    rule above): a line that is not a JSON object comes back with only ``_corrupt_record``
    set; a field of the wrong type comes back null with the line in ``_corrupt_record``, which
    is then re-read as a map to tell "present but invalid" from "absent".
    """
    from pyspark.sql import functions as F

    fields = [n for n in all_fields() if n != "v"]
    df = (spark.read.schema(record_schema()).option("mode", "PERMISSIVE")
          .option("columnNameOfCorruptRecord", "_corrupt_record")
          .option("lineSep", "\n")
          .option("recursiveFileLookup", "true").json(list(paths))
          .select("*", F.col("_metadata.file_path").alias("file")))
    df = df.select("*", F.expr("CASE WHEN _corrupt_record IS NOT NULL THEN "
                               "from_json(_corrupt_record, 'map<string,string>') END")
                   .alias("raw"))
    checked = df.select("*", F.expr(error_sql()).alias("err"))
    text = F.coalesce(F.col("_corrupt_record"), F.to_json(F.struct("v", *fields)))
    return checked.select(
        "v", *fields, "err",
        F.when(F.col("err").isNotNull(), F.substring(text, 1, 300)).alias("line"),
        F.when(F.col("err").isNotNull(), F.col("file")).alias("file"))


def error_class(reason: str | None) -> str | None:
    """``corrupt`` / ``invalid`` / None for a reason."""
    if reason is None:
        return None
    return "corrupt" if reason == CORRUPT else "invalid"
