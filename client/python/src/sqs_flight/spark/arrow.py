"""Arrow and Spark: the Spark schema of a table, and the batches a task
hands to Spark (joined into larger ones and cast to the query's schema)."""

from __future__ import annotations

from typing import Iterator, List

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.types import DataType, IntegerType, LongType, MapType, ShortType, StructType

from ..client import SqsFlightError


def spark_type(arrow: pa.DataType) -> DataType:
    """The Spark type of an Arrow type of a table, payload types included.

    Spark has no unsigned integers: uint8, uint16 and uint32 widen to the
    next signed type and uint64 becomes decimal(20, 0). Timestamps become
    ``timestamp`` (with a time zone) or ``timestamp_ntz`` (without), in
    microseconds: nanoseconds are truncated. Nested structs, lists and maps
    are mapped field by field.
    """
    from pyspark.sql.pandas.types import from_arrow_type
    from pyspark.sql.types import ArrayType, DecimalType, StructField

    if pa.types.is_struct(arrow):
        return StructType([StructField(f.name, spark_type(f.type), f.nullable) for f in arrow])
    if pa.types.is_list(arrow) or pa.types.is_large_list(arrow):
        return ArrayType(spark_type(arrow.value_type), arrow.value_field.nullable)
    if pa.types.is_map(arrow):
        return MapType(spark_type(arrow.key_type), spark_type(arrow.item_type), arrow.item_field.nullable)
    unsigned = {
        pa.uint8(): ShortType(),
        pa.uint16(): IntegerType(),
        pa.uint32(): LongType(),
        pa.uint64(): DecimalType(20, 0),
    }
    if arrow in unsigned:
        return unsigned[arrow]
    return from_arrow_type(arrow)


def spark_schema(arrow: pa.Schema) -> StructType:
    """The Spark schema of a table's Arrow schema (see :func:`spark_type`)."""
    from pyspark.sql.types import StructField

    return StructType([StructField(f.name, spark_type(f.type), f.nullable) for f in arrow])


def arrow_schema(schema: StructType) -> pa.Schema:
    """The exact Arrow schema Spark expects back from ``read`` (us timestamps, UTC)."""
    from pyspark.sql.pandas.types import to_arrow_schema

    try:
        return to_arrow_schema(schema, timezone="UTC")
    except TypeError:  # pyspark 4.0 has no timezone argument (and uses UTC)
        return to_arrow_schema(schema)


#: Rows and bytes handed to Spark per Arrow batch. The server streams each
#: receive of ten as soon as it has it; Spark and the cast to its schema pay
#: per batch, so a task joins them before handing them over.
SPARK_BATCH_ROWS = 8192
SPARK_BATCH_BYTES = 16 << 20


def rebatch(
    batches: Iterator[pa.RecordBatch], rows: int = SPARK_BATCH_ROWS, nbytes: int = SPARK_BATCH_BYTES
) -> Iterator[pa.RecordBatch]:
    """``batches`` joined, in order, into batches of at least ``rows`` rows
    or ``nbytes`` bytes (the last may be smaller); empty batches are dropped."""
    pending: List[pa.RecordBatch] = []
    held_rows = held_bytes = 0
    for batch in batches:
        if not batch.num_rows:
            continue
        pending.append(batch)
        held_rows += batch.num_rows
        held_bytes += batch.nbytes
        if held_rows >= rows or held_bytes >= nbytes:
            yield _join(pending)
            pending, held_rows, held_bytes = [], 0, 0
    if pending:
        yield _join(pending)


def _join(batches: List[pa.RecordBatch]) -> pa.RecordBatch:
    if len(batches) == 1:
        return batches[0]
    if hasattr(pa, "concat_batches"):  # pyarrow >= 19
        return pa.concat_batches(batches)
    joined = pa.Table.from_batches(batches).combine_chunks().to_batches()
    return joined[0]


def without_payload_errors(batch: pa.RecordBatch) -> pa.RecordBatch:
    """The rows of ``batch`` whose payload decoded (``payload_error`` null)."""
    return batch.filter(pc.is_null(batch.column("payload_error")))


def conform(batch: pa.RecordBatch, target: pa.Schema) -> pa.RecordBatch:
    """``batch`` cast column by column (by name) to ``target``."""
    columns = []
    for field in target:
        index = batch.schema.get_field_index(field.name)
        if index < 0:
            raise SqsFlightError(
                "INVALID_ARGUMENT",
                f"column {field.name!r} of the query schema is not in the table "
                f"(columns: {', '.join(batch.schema.names)})",
            )
        # Spark keeps microseconds: nanosecond timestamps are truncated, not refused.
        options = pc.CastOptions(field.type, allow_time_truncate=True)
        columns.append(pc.cast(batch.column(index), options=options))
    return pa.RecordBatch.from_arrays(columns, schema=target)
