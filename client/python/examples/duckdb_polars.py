"""Read one batch of a queue table into DuckDB and Polars, then commit it.

Runs against a server started with no arguments (`sqs-flight-server`), which
serves the in-memory `demo` table of JSON order events:

    python examples/duckdb_polars.py [grpc://127.0.0.1:50051] [demo]

If anything fails before the commit, the batch is released: its messages are
visible again at once, instead of after the consumer's lease.
"""

import sys

import duckdb
import polars as pl

import sqs_flight

URL = sys.argv[1] if len(sys.argv) > 1 else "grpc://127.0.0.1:50051"
TABLE = sys.argv[2] if len(sys.argv) > 2 else "demo"

# One batch for the consumer "report": the messages stay invisible in SQS
# until the commit below; reading batch=N again replays the same rows.
events = sqs_flight.read_batch(URL, TABLE, consumer="report", max_wait_ms=500)
n = events.num_rows
print(f"batch {sqs_flight.batch_of(events)}: {n} message{'' if n == 1 else 's'}")
try:
    # DuckDB queries the pyarrow table by its variable name; bodies that are
    # not JSON are left out rather than failing the query.
    per_event = duckdb.sql("""
        SELECT json_extract_string(body, '$.event') AS event,
               count(*) AS n,
               sum(TRY_CAST(json_extract(body, '$.amount_cents') AS BIGINT)) AS cents
        FROM events WHERE json_valid(body) GROUP BY event ORDER BY event
    """).fetchall()
    print("duckdb:", per_event)

    # Polars reads it zero-copy.
    df = pl.from_arrow(events)
    paid = df.filter(pl.col("body").str.json_path_match("$.event") == "order_paid")
    print("polars: order_paid events:", paid.height)
except BaseException:
    # Give the batch back now: left alone, its messages would stay invisible
    # for the consumer's lease (300 s) and a rerun would not see them.
    sqs_flight.release(URL, TABLE, "report")
    raise

# Done with the batch: delete its messages from SQS.
print("commit:", sqs_flight.commit(URL, TABLE, "report", sqs_flight.batch_of(events)))
