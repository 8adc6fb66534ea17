"""What :func:`sqs_flight.write` accepts, turned into DoPut record batches.

DoPut (the top-level README, "The Flight surface") takes a ``body`` column (any Arrow string type) and the
optional ``message_group_id``, ``message_deduplication_id`` (strings),
``delay_seconds`` (any integer) and ``message_attributes`` (map of strings).
The server checks every column and every row; this module only gets the
common shapes of pandas, Polars and DuckDB data into those types and cuts
the stream into batches of a bounded size:

* anything Arrow-shaped: a pyarrow Table, RecordBatch or RecordBatchReader,
  any object with ``__arrow_c_stream__`` (Polars and DuckDB results, pandas
  >= 2.2) or ``__arrow_c_array__``; a pandas DataFrame (its index is not
  sent); a list of strings (the bodies);
* dictionary-encoded strings (pandas categoricals, Polars Categorical) become
  plain strings;
* ``delay_seconds`` in floats (pandas turns an integer column with a missing
  value into float64) becomes int64 when every value is whole;
* ``message_attributes`` may be a map of strings, a list of
  ``{key, value}`` structs (what Polars makes of a map), or a struct of
  string fields (what ``pa.Table.from_pylist`` and pandas make of dicts):
  each becomes ``map<string, string>``; a null value drops that attribute.

Unknown columns are left for the server to refuse by name.
"""

from __future__ import annotations

from typing import Any, Iterator, Optional

import pyarrow as pa
import pyarrow.compute as pc

BODY = "body"
GROUP = "message_group_id"
DEDUP = "message_deduplication_id"
DELAY = "delay_seconds"
ATTRIBUTES = "message_attributes"
#: The columns DoPut reads; ``body`` is required.
COLUMNS = (BODY, GROUP, DEDUP, DELAY, ATTRIBUTES)

#: Rows per DoPut batch: the server answers one PutResult per batch.
DEFAULT_BATCH_ROWS = 1000
#: Arrow bytes per DoPut batch, well below the server's 64 MiB gRPC message limit.
DEFAULT_BATCH_BYTES = 8 << 20

ATTRIBUTES_TYPE = pa.map_(pa.string(), pa.string())


def as_reader(data: Any) -> pa.RecordBatchReader:
    """``data`` as a stream of record batches (see the module doc)."""
    if isinstance(data, pa.RecordBatchReader):
        return data
    if isinstance(data, pa.Table):
        return data.to_reader()
    if isinstance(data, pa.RecordBatch):
        return pa.RecordBatchReader.from_batches(data.schema, [data])
    if _is_pandas(data):
        return pa.Table.from_pandas(data, preserve_index=False).to_reader()
    if hasattr(data, "__arrow_c_stream__"):
        return pa.RecordBatchReader.from_stream(data)
    if hasattr(data, "__arrow_c_array__"):
        batch = pa.record_batch(data)
        return pa.RecordBatchReader.from_batches(batch.schema, [batch])
    if isinstance(data, (list, tuple)) and all(isinstance(x, str) for x in data):
        return pa.table({BODY: pa.array(data, pa.string())}).to_reader()
    raise TypeError(
        f"cannot send a {type(data).__module__}.{type(data).__name__}: pass a pyarrow Table, "
        "RecordBatch or RecordBatchReader, an object with __arrow_c_stream__ (a Polars "
        "DataFrame, a DuckDB result), a pandas DataFrame, or a list of body strings"
    )


def _is_pandas(data: Any) -> bool:
    return type(data).__module__.startswith("pandas.") and type(data).__name__ == "DataFrame"


def _is_text(t: pa.DataType) -> bool:
    return pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t)


def _plain(column: pa.Array) -> pa.Array:
    """Dictionary-encoded strings decoded."""
    if pa.types.is_dictionary(column.type) and _is_text(column.type.value_type):
        return column.cast(column.type.value_type)
    return column


def _delay(column: pa.Array) -> pa.Array:
    if pa.types.is_floating(column.type):
        try:
            return column.cast(pa.int64())  # a safe cast: 1.5 is refused
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
            raise ValueError(f"column {DELAY!r} must hold whole seconds: {e}") from None
    return column


def _attributes(column: pa.Array) -> pa.Array:
    t = column.type
    if pa.types.is_map(t):
        return column
    if (pa.types.is_list(t) or pa.types.is_large_list(t)) and pa.types.is_struct(t.value_type):
        entry = t.value_type
        if entry.num_fields == 2 and all(_is_text(entry.field(i).type) for i in range(2)):
            return _entries_to_map(column)
    if pa.types.is_struct(t) and all(
        _is_text(t.field(i).type) or pa.types.is_null(t.field(i).type) for i in range(t.num_fields)
    ):
        return _struct_to_map(column)
    raise ValueError(
        f"column {ATTRIBUTES!r} is {t}: it must be a map of strings, a list of "
        "{key, value} string structs, or a struct of string fields"
    )


def _entries_to_map(column: pa.Array) -> pa.Array:
    lengths = pc.fill_null(pc.list_value_length(column), 0).cast(pa.int64())
    ends = pc.cumulative_sum(lengths).to_pylist() if len(column) else []
    offsets = pa.array([0] + ends, pa.int32())
    flat = column.flatten()  # the non-null sub-lists, slice-aware
    keys, values = flat.field(0).cast(pa.string()), flat.field(1).cast(pa.string())
    if keys.null_count:
        raise ValueError(f"column {ATTRIBUTES!r} has an attribute with a null name")
    return pa.MapArray.from_arrays(offsets, keys, values, type=ATTRIBUTES_TYPE, mask=column.is_null())


def _struct_to_map(column: pa.Array) -> pa.Array:
    rows = [None if row is None else [(k, v) for k, v in row.items() if v is not None] for row in column.to_pylist()]
    return pa.array(rows, ATTRIBUTES_TYPE)


def normalize(batch: pa.RecordBatch) -> pa.RecordBatch:
    """The DoPut columns of ``batch`` in types the server takes (module doc)."""
    columns, fields = [], []
    for field, column in zip(batch.schema, batch.columns):
        if field.name in (BODY, GROUP, DEDUP):
            column = _plain(column)
        elif field.name == DELAY:
            column = _delay(column)
        elif field.name == ATTRIBUTES:
            column = _attributes(column)
        columns.append(column)
        fields.append(pa.field(field.name, column.type, field.nullable))
    return pa.RecordBatch.from_arrays(columns, schema=pa.schema(fields))


def chunks(batch: pa.RecordBatch, max_rows: int, max_bytes: int) -> Iterator[pa.RecordBatch]:
    """``batch`` cut into slices of at most ``max_rows`` rows and, down to one
    row, ``max_bytes`` Arrow bytes."""
    for start in range(0, batch.num_rows, max_rows):
        yield from _by_bytes(batch.slice(start, max_rows), max_bytes)


def _by_bytes(batch: pa.RecordBatch, max_bytes: int) -> Iterator[pa.RecordBatch]:
    if batch.num_rows <= 1 or batch.nbytes <= max_bytes:
        yield batch
        return
    half = batch.num_rows // 2
    yield from _by_bytes(batch.slice(0, half), max_bytes)
    yield from _by_bytes(batch.slice(half), max_bytes)


def prepared(
    reader: pa.RecordBatchReader,
    max_rows: int = DEFAULT_BATCH_ROWS,
    max_bytes: int = DEFAULT_BATCH_BYTES,
) -> Iterator[pa.RecordBatch]:
    """The batches of ``reader``, normalized and cut for DoPut; empty ones skipped."""
    for batch in reader:
        if batch.num_rows:
            yield from chunks(normalize(batch), max_rows, max_bytes)


def prepared_schema(schema: pa.Schema) -> pa.Schema:
    """The schema :func:`normalize` gives batches of ``schema``."""
    empty = pa.RecordBatch.from_arrays([pa.array([], f.type) for f in schema], schema=schema)
    return normalize(empty).schema


def parse_sent(metadata: Optional[pa.Buffer]) -> int:
    """``n`` of a PutResult's ``{"sent": n}``."""
    import json

    if metadata is None:
        raise ValueError("no PutResult")
    return int(json.loads(metadata.to_pybytes())["sent"])
