"""Flight SQL from the tools that speak it: ADBC's Flight SQL driver (DB-API),
Polars (``read_database_uri`` and ``read_database``), DuckDB over an ADBC
result, pandas; with a token, and over TLS. Every query is a peek: the
queue is as it was afterwards, and no consumer stays behind."""

from __future__ import annotations

import json

import pytest

import sqs_flight

from conftest import TOKEN

try:
    import adbc_driver_flightsql.dbapi as flight_sql
    from adbc_driver_flightsql import DatabaseOptions
except ImportError:  # pragma: no cover - scripts/test.sh installs it
    pytest.fail(
        "adbc-driver-flightsql is not installed: pip install 'adbc-driver-flightsql==1.13.0' "
        "'adbc-driver-manager==1.13.0' (scripts/test.sh does this)",
        pytrace=False,
    )

# ADBC's DB-API warns that a read-only server's connection stays in autocommit.
pytestmark = pytest.mark.filterwarnings("ignore:Cannot disable autocommit")


def connect(url: str, **db_kwargs: str):
    return flight_sql.connect(url, db_kwargs=db_kwargs or None)


@pytest.fixture
def orders(rustack, start_server):
    """A queue of 30 JSON events behind a server: (server url, queue url, bodies)."""
    queue = rustack.new_queue("sql")
    sent = [json.dumps({"event": "paid" if i % 3 else "created", "amount": i}) for i in range(30)]
    rustack.send(queue, sent)
    server = start_server(rustack, {"orders": queue})
    return server.url, queue, sent


def untouched(rustack, url: str, queue: str, n: int) -> None:
    assert rustack.counts(queue) == {"visible": n, "in_flight": 0}
    assert sqs_flight.status(url, "orders")["tables"]["orders"]["consumers"] == {}


def test_adbc_runs_sql_with_the_json_functions_and_leaves_the_queue_as_it_was(rustack, orders):
    url, queue, sent = orders
    with connect(url) as conn, conn.cursor() as cur:
        cur.execute(
            "SELECT json_get_str(body, 'event') AS event, count(*) AS n, "
            "sum(json_get_int(body, 'amount')) AS total FROM orders GROUP BY event ORDER BY event"
        )
        rows = cur.fetch_arrow_table().to_pylist()
        assert rows == [
            {"event": "created", "n": 10, "total": sum(range(0, 30, 3))},
            {"event": "paid", "n": 20, "total": sum(i for i in range(30) if i % 3)},
        ]
        cur.execute("SELECT body FROM orders")
        assert sorted(cur.fetch_df()["body"]) == sorted(sent), "pandas, through ADBC"
    untouched(rustack, url, queue, 30)


def test_polars_and_duckdb_read_through_adbc(rustack, orders):
    import duckdb
    import polars as pl

    url, queue, sent = orders
    uri = url.replace("grpc://", "flightsql://") + "?transport=tcp"
    df = pl.read_database_uri("SELECT message_id, body FROM orders", uri, engine="adbc")
    assert df.shape == (30, 2) and sorted(df["body"].to_list()) == sorted(sent)
    with connect(url) as conn:
        counted = pl.read_database("SELECT count(*) AS n FROM orders", conn)
        assert counted.to_dicts() == [{"n": 30}]
        with conn.cursor() as cur:
            cur.execute("SELECT body, receive_count FROM orders")
            result = cur.fetch_arrow_table()  # noqa: F841 (DuckDB finds it by name)
        got = duckdb.sql("SELECT count(*), min(receive_count) FROM result").fetchall()
        assert got[0][0] == 30 and got[0][1] >= 1
    untouched(rustack, url, queue, 30)


def test_the_catalog_lists_the_queue_tables(default_server):
    with connect(default_server.url) as conn:
        objects = conn.adbc_get_objects(depth="columns").read_all().to_pylist()
        assert [c["catalog_name"] for c in objects] == ["sqs_flight"]
        (schema,) = objects[0]["catalog_db_schemas"]
        assert schema["db_schema_name"] == "public"
        (table,) = schema["db_schema_tables"]
        assert table["table_name"] == "demo" and table["table_type"] == "TABLE"
        columns = [c["column_name"] for c in table["table_columns"]]
        assert columns[:2] == ["message_id", "body"]
        assert conn.adbc_get_table_schema("demo").names == columns
        info = conn.adbc_get_info()
        assert info["vendor_name"] == "sqs-flight"
        assert info["vendor_version"] == sqs_flight.__version__


def test_bad_sql_and_writes_are_refused_with_the_message_that_says_why(default_server):
    import adbc_driver_manager

    with connect(default_server.url) as conn, conn.cursor() as cur:
        with pytest.raises(adbc_driver_manager.ProgrammingError, match="table 'sqs_flight.public.nope' not found"):
            cur.execute("SELECT * FROM nope")
        with pytest.raises(adbc_driver_manager.ProgrammingError, match="read-only"):
            cur.execute("DELETE FROM demo")
        cur.execute("SELECT count(*) AS n FROM demo")
        assert cur.fetch_arrow_table().to_pylist() == [{"n": 20}], "nothing was changed"


def test_a_token_is_required_and_accepted_over_tls(tls_server):  # noqa: F811
    import adbc_driver_manager

    url, pem = tls_server["url"], tls_server["cert"].read_text()
    options = {DatabaseOptions.TLS_ROOT_CERTS.value: pem}
    with connect(url, **options) as conn, conn.cursor() as cur:
        with pytest.raises(adbc_driver_manager.Error, match="(?i)unauthenticated|authorization"):
            cur.execute("SELECT count(*) AS n FROM demo")
    options[DatabaseOptions.AUTHORIZATION_HEADER.value] = f"Bearer {TOKEN}"
    with connect(url, **options) as conn, conn.cursor() as cur:
        cur.execute("SELECT count(*) AS n FROM demo")
        assert cur.fetch_arrow_table().to_pylist() == [{"n": 20}]
