"""Read one batch of a queue table into DuckDB and Polars, then commit it.

Runs against a server started with no arguments (`sqs-flight-server`), which
serves the in-memory `demo` table of JSON order events:

    python examples/duckdb_polars.py [grpc://127.0.0.1:50051] [demo]
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
print(f"batch {sqs_flight.batch_of(events)}: {events.num_rows} messages")

# DuckDB queries the pyarrow table by its variable name.
per_event = duckdb.sql("""
    SELECT json_extract_string(body, '$.event') AS event,
           count(*) AS n,
           sum(CAST(json_extract(body, '$.amount_cents') AS BIGINT)) AS cents
    FROM events GROUP BY event ORDER BY event
""").fetchall()
print("duckdb:", per_event)

# Polars reads it zero-copy.
df = pl.from_arrow(events)
paid = df.filter(pl.col("body").str.json_path_match("$.event") == "order_paid")
print("polars: order_paid events:", paid.height)

# Done with the batch: delete its messages from SQS.
print("commit:", sqs_flight.commit(URL, TABLE, "report", sqs_flight.batch_of(events)))
