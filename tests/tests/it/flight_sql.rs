//! Flight SQL on the server's port, through arrow-flight's Flight SQL
//! client, against moto: planning receives nothing, a query is a peek that
//! leaves every message visible and no consumer behind, the DoGet schema is
//! the FlightInfo's, the metadata calls answer, bad and writing SQL is
//! refused with the right status, and the JSON surface still works beside it.

use arrow_array::{Array, RecordBatch};
use arrow_flight::sql::client::FlightSqlServiceClient;
use arrow_flight::sql::{CommandGetDbSchemas, CommandGetTables, SqlInfo};
use arrow_schema::Schema;
use futures::TryStreamExt;
use serde_json::json;
use sqs_flight_tests::moto;
use tonic::Code;
use tonic::transport::Channel;

use sqs_flight_tests::flight_sql::{code, fetch, info_schema, sql_client, ticket};
use sqs_flight_tests::prelude::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn planning_receives_nothing_and_a_query_peeks_leaving_everything_visible() {
    let sqs = moto::moto().client().await;
    let url = moto::create_queue(&sqs, "sql", &[]).await;
    moto::send_bodies(&sqs, &url, (0..8).map(|i| format!("{{\"n\": {i}}}"))).await;
    let (mut f, ops) = Fixture::serve_with_metrics(sqs, url).await;
    let mut sql = sql_client(&f.server.url).await;

    // Statement and prepared statement: GetFlightInfo only plans.
    let info = bounded(sql.execute("SELECT body FROM t".into(), None))
        .await
        .unwrap();
    let mut prepared = bounded(sql.prepare("SELECT body FROM t".into(), None))
        .await
        .unwrap();
    let prepared_info = bounded(prepared.execute()).await.unwrap();
    assert_eq!(f.counts().await, (8, 0), "planning received nothing");

    let (schema, batches) = fetch(&mut sql, &info).await.unwrap();
    assert_eq!(
        schema,
        info_schema(&info),
        "the DoGet schema is the FlightInfo's"
    );
    let expected: Vec<String> = {
        let mut v: Vec<String> = (0..8).map(|i| format!("{{\"n\": {i}}}")).collect();
        v.sort();
        v
    };
    assert_eq!(sorted(texts(&batches, "body")), expected);
    assert_eq!(f.counts().await, (8, 0), "the peek gave every message back");

    let (schema, batches) = fetch(&mut sql, &prepared_info).await.unwrap();
    assert_eq!(schema, info_schema(&prepared_info));
    assert_eq!(sorted(texts(&batches, "body")), expected);
    bounded(prepared.close()).await.unwrap();
    assert_eq!(f.counts().await, (8, 0));

    // No consumer left behind, in status or in the metrics.
    let status = action_on(&mut f.flight, "status", &json!({"table": "t"}))
        .await
        .unwrap();
    assert_eq!(status["tables"]["t"]["consumers"], json!({}), "{status}");
    let (_, metrics) = sqs_flight_tests::http::get(ops, "/metrics").await;
    assert!(
        !metrics.contains("sql-peek-"),
        "peek consumers stay out of the metrics:\n{metrics}"
    );

    // The JSON surface is unchanged beside it.
    let plain = f
        .plan(json!({"table": "t", "consumer": "c", "max_wait_ms": 300}))
        .await
        .unwrap();
    assert_eq!(plain.endpoint.len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sql_functions_and_limit_work_and_an_empty_result_sends_its_schema() {
    let sqs = moto::moto().client().await;
    let url = moto::create_queue(&sqs, "sql-fn", &[]).await;
    let bodies = [
        "{\"event\": \"a\"}",
        "{\"event\": \"b\"}",
        "{\"event\": \"a\"}",
    ];
    moto::send_bodies(&sqs, &url, bodies.iter().map(|s| s.to_string())).await;
    let f = Fixture::serve(sqs, url, |_| {}, |_| {}).await;
    let mut sql = sql_client(&f.server.url).await;

    let q = "SELECT json_get_str(body, 'event') AS event, count(*) AS n FROM t GROUP BY event ORDER BY event";
    let info = bounded(sql.execute(q.into(), None)).await.unwrap();
    let (schema, batches) = fetch(&mut sql, &info).await.unwrap();
    assert_eq!(schema, info_schema(&info));
    let events = sorted(texts(&batches, "event"));
    let counts: Vec<i64> = batches
        .iter()
        .flat_map(|b| {
            let n = b.column_by_name("n").unwrap();
            let n = n
                .as_any()
                .downcast_ref::<arrow_array::Int64Array>()
                .unwrap();
            n.values().to_vec()
        })
        .collect();
    assert_eq!(
        (events, counts),
        (vec!["a".to_string(), "b".to_string()], vec![2, 1])
    );

    let info = bounded(sql.execute("SELECT body FROM t WHERE body = 'none'".into(), None))
        .await
        .unwrap();
    let (schema, batches) = fetch(&mut sql, &info).await.unwrap();
    assert_eq!(
        schema,
        info_schema(&info),
        "an empty result still sends its schema"
    );
    assert_eq!(batches.iter().map(RecordBatch::num_rows).sum::<usize>(), 0);
    assert_eq!(f.counts().await, (3, 0));
}

/// The `receive_count` of every message: each peek that received a message
/// raised it by one.
async fn receive_counts(sql: &mut FlightSqlServiceClient<Channel>) -> Vec<i64> {
    let q = "SELECT CAST(receive_count AS BIGINT) FROM t ORDER BY 1";
    let info = bounded(sql.execute(q.into(), None)).await.unwrap();
    let (_, batches) = fetch(sql, &info).await.unwrap();
    batches
        .iter()
        .flat_map(|b| {
            let c = arrow_array::cast::AsArray::as_primitive::<arrow_array::types::Int64Type>(
                b.column(0).as_ref(),
            );
            c.values().to_vec()
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limit_is_pushed_down_to_the_peek_which_receives_only_that_many() {
    let f = Fixture::standard(8).await;
    let mut sql = sql_client(&f.server.url).await;
    let info = bounded(sql.execute("SELECT message_id FROM t LIMIT 2".into(), None))
        .await
        .unwrap();
    let (_, batches) = fetch(&mut sql, &info).await.unwrap();
    assert_eq!(batches.iter().map(RecordBatch::num_rows).sum::<usize>(), 2);
    assert_eq!(f.counts().await, (8, 0), "the peek gave its messages back");
    // A full peek now receives every message once more: the two that the
    // LIMIT query received twice in all, the others once.
    let counts = receive_counts(&mut sql).await;
    assert_eq!(
        counts,
        [1, 1, 1, 1, 1, 1, 2, 2],
        "only 2 messages were received for LIMIT 2"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn copy_to_and_row_generators_are_refused_and_write_nothing() {
    let f = Fixture::standard(2).await;
    let mut sql = sql_client(&f.server.url).await;
    let scratch = temp_dir("copy");
    let dir = scratch.path().join("out");
    let target = dir.join("out.csv");
    let copies = [
        format!("COPY (SELECT body FROM t) TO '{}'", target.display()),
        format!("COPY t TO '{}' STORED AS CSV", target.display()),
    ];
    for q in &copies {
        let (got, message) = code(bounded(sql.execute(q.clone(), None)).await.unwrap_err());
        assert_eq!(got, Code::InvalidArgument, "{q}: {message}");
        assert!(message.contains("read-only"), "{q}: {message}");
    }
    assert!(
        !target.exists() && !dir.exists(),
        "COPY wrote {}",
        target.display()
    );
    let generators = [
        (
            "SELECT * FROM range(1000000000000)",
            "range() is not available",
        ),
        (
            "SELECT * FROM generate_series(1, 1000000000000)",
            "generate_series() is not available",
        ),
        ("SELECT unnest(range(1000000000000))", "range"),
        (
            "SELECT generate_series(1, 1000000000000)",
            "generate_series",
        ),
        ("SELECT array_repeat(1, 1000000000000)", "array_repeat"),
    ];
    for (q, text) in generators {
        let (got, message) = code(bounded(sql.execute(q.into(), None)).await.unwrap_err());
        assert_eq!(got, Code::InvalidArgument, "{q}: {message}");
        assert!(message.contains(text), "{q}: {message}");
    }
    assert_eq!(
        f.counts().await,
        (2, 0),
        "refused statements received nothing"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_and_writing_sql_is_refused_with_the_right_status() {
    let f = Fixture::standard(2).await;
    let mut sql = sql_client(&f.server.url).await;
    let cases = [
        (
            "SELECT * FROM nope",
            Code::NotFound,
            "table 'sqs_flight.public.nope' not found",
        ),
        ("SELEC 1", Code::InvalidArgument, "SELEC"),
        (
            "SELECT no_such_column FROM t",
            Code::InvalidArgument,
            "no_such_column",
        ),
        (
            "INSERT INTO t (body) VALUES ('x')",
            Code::InvalidArgument,
            "read-only",
        ),
        ("CREATE TABLE x (a INT)", Code::InvalidArgument, "read-only"),
        (
            "SET datafusion.execution.batch_size = 10",
            Code::InvalidArgument,
            "read-only",
        ),
    ];
    for (q, want, text) in cases {
        let (got, message) = code(bounded(sql.execute(q.into(), None)).await.unwrap_err());
        assert_eq!(got, want, "{q}: {message}");
        assert!(message.contains(text), "{q}: {message}");
        let (got, _) = code(bounded(sql.prepare(q.into(), None)).await.err().unwrap());
        assert_eq!(got, want, "prepare {q}");
    }
    assert_eq!(
        f.counts().await,
        (2, 0),
        "refused statements changed nothing"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_metadata_calls_list_the_queue_tables_with_their_schema() {
    let mut f = Fixture::standard(0).await;
    let mut sql = sql_client(&f.server.url).await;

    let info = bounded(sql.get_catalogs()).await.unwrap();
    let (_, batches) = fetch(&mut sql, &info).await.unwrap();
    assert_eq!(sorted(texts(&batches, "catalog_name")), ["sqs_flight"]);

    let info = bounded(sql.get_db_schemas(CommandGetDbSchemas::default()))
        .await
        .unwrap();
    let (_, batches) = fetch(&mut sql, &info).await.unwrap();
    assert_eq!(sorted(texts(&batches, "db_schema_name")), ["public"]);

    let request = CommandGetTables {
        include_schema: true,
        ..Default::default()
    };
    let info = bounded(sql.get_tables(request)).await.unwrap();
    let (schema, batches) = fetch(&mut sql, &info).await.unwrap();
    assert_eq!(schema, info_schema(&info));
    assert_eq!(sorted(texts(&batches, "table_name")), ["t"]);
    assert_eq!(sorted(texts(&batches, "table_type")), ["TABLE"]);
    let table_schema = batches[0]
        .column_by_name("table_schema")
        .expect("table_schema")
        .as_any()
        .downcast_ref::<arrow_array::BinaryArray>()
        .expect("IPC bytes")
        .value(0)
        .to_vec();
    let decoded = arrow_ipc::convert::try_schema_from_ipc_buffer(&table_schema).unwrap();
    let plain = f
        .plan(json!({"table": "t", "consumer": "schema"}))
        .await
        .unwrap();
    assert_eq!(
        decoded,
        info_schema(&plain),
        "the table's schema, as the JSON surface has it"
    );

    let info = bounded(sql.get_table_types()).await.unwrap();
    let (_, batches) = fetch(&mut sql, &info).await.unwrap();
    assert_eq!(sorted(texts(&batches, "table_type")), ["TABLE"]);

    let info = bounded(sql.get_sql_info(vec![
        SqlInfo::FlightSqlServerName,
        SqlInfo::FlightSqlServerReadOnly,
    ]))
    .await
    .unwrap();
    let (_, batches) = fetch(&mut sql, &info).await.unwrap();
    let names: Vec<u32> = batches
        .iter()
        .flat_map(|b| {
            let n = b.column_by_name("info_name").unwrap();
            n.as_any()
                .downcast_ref::<arrow_array::UInt32Array>()
                .unwrap()
                .values()
                .to_vec()
        })
        .collect();
    assert_eq!(
        names,
        [
            SqlInfo::FlightSqlServerName as u32,
            SqlInfo::FlightSqlServerReadOnly as u32
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_queries_at_once_each_peek_and_leave_everything_visible() {
    let f = Fixture::standard(6).await;
    let (mut a, mut b) = (
        sql_client(&f.server.url).await,
        sql_client(&f.server.url).await,
    );
    let q = "SELECT count(*) AS n FROM t";
    let (ia, ib) = (
        bounded(a.execute(q.into(), None)).await.unwrap(),
        bounded(b.execute(q.into(), None)).await.unwrap(),
    );
    let (ra, rb) = tokio::join!(fetch(&mut a, &ia), fetch(&mut b, &ib));
    let n = |r: (Schema, Vec<RecordBatch>)| {
        let b = &r.1[0];
        b.column(0)
            .as_any()
            .downcast_ref::<arrow_array::Int64Array>()
            .unwrap()
            .value(0)
    };
    let (na, nb) = (n(ra.unwrap()), n(rb.unwrap()));
    // Each peek has a consumer of its own: SQS hands a message to one
    // receive at a time, so two at once may split the queue, and one that
    // ended first gives its messages back for the other to see. Between
    // them they saw everything, and left everything visible.
    assert!(na <= 6 && nb <= 6 && na + nb >= 6, "{na} + {nb}");
    assert_eq!(f.counts().await, (6, 0));
    let status = action_on(
        &mut connect(&f.server.url).await,
        "status",
        &json!({"table": "t"}),
    )
    .await
    .unwrap();
    assert_eq!(status["tables"]["t"]["consumers"], json!({}), "{status}");
}

/// How long the abandoned peek below would go on by itself: its idle wait.
const LONG_PEEK_MS: u64 = 120_000;
/// Bound on the abandoned peek's release, far below [`LONG_PEEK_MS`].
const ABANDONED_RELEASE_BOUND: std::time::Duration = std::time::Duration::from_secs(30);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_query_whose_client_goes_away_gives_its_messages_back() {
    // After the 3 messages the peek would wait 120 s for more: only its
    // abandonment can end it within the 30 s this test waits.
    let sqs = moto::moto().client().await;
    let url = moto::queue_holding(&sqs, "sql-gone", 3).await;
    let long = |t: &mut sqs_flight_server::config::TableConfig| {
        t.defaults.max_wait_ms = LONG_PEEK_MS;
        t.defaults.max_duration_ms = 2 * LONG_PEEK_MS;
    };
    let f = Fixture::serve(sqs, url, long, |c| {
        c.limits.max_wait_ms = LONG_PEEK_MS;
    })
    .await;
    let mut sql = sql_client(&f.server.url).await;
    let info = bounded(sql.execute("SELECT body FROM t".into(), None))
        .await
        .unwrap();
    let ticket = ticket(&info);
    let reading = tokio::spawn(async move { sql.do_get(ticket).await.map(|_| ()) });
    poll(STEP, async || f.counts().await, |c| *c == (0, 3))
        .await
        .expect("the peek holds the 3 messages");
    assert!(
        !reading.is_finished(),
        "the query was still reading when its client went away"
    );
    // The client goes away: its call and connection are dropped.
    reading.abort();
    let _ = reading.await;
    let gone = std::time::Instant::now();
    let mut flight = connect(&f.server.url).await;
    let released = poll(
        ABANDONED_RELEASE_BOUND,
        async || {
            let status = action_on(&mut flight, "status", &json!({"table": "t"}))
                .await
                .unwrap();
            (status["tables"]["t"]["consumers"].clone(), f.counts().await)
        },
        |(consumers, counts)| *consumers == json!({}) && *counts == (3, 0),
    )
    .await;
    assert!(
        released.is_ok(),
        "the abandoned peek still holds its batch (consumers, counts): {released:?}"
    );
    eprintln!(
        "abandoned peek released {:?} after its client went away",
        gone.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_schema_answers_a_statement_and_do_put_of_a_flight_sql_command_is_refused() {
    use arrow_flight::sql::{CommandStatementQuery, CommandStatementUpdate, ProstMessageExt};
    use arrow_flight::{FlightDescriptor, encode::FlightDataEncoderBuilder};
    use prost::Message;

    let mut f = Fixture::standard(1).await;
    let query = CommandStatementQuery {
        query: "SELECT message_id, receive_count FROM t".into(),
        transaction_id: None,
    };
    let descriptor = FlightDescriptor::new_cmd(query.as_any().encode_to_vec());
    let schema = bounded(f.flight.get_schema(descriptor)).await.unwrap();
    let names: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
    assert_eq!(names, ["message_id", "receive_count"]);
    assert_eq!(f.counts().await, (1, 0), "GetSchema received nothing");

    let update = CommandStatementUpdate {
        query: "INSERT INTO t (body) VALUES ('x')".into(),
        transaction_id: None,
    };
    let body = arrow_schema::Field::new("body", arrow_schema::DataType::Utf8, false);
    let data = FlightDataEncoderBuilder::new()
        .with_schema(std::sync::Arc::new(Schema::new(vec![body])))
        .with_flight_descriptor(Some(FlightDescriptor::new_cmd(
            update.as_any().encode_to_vec(),
        )))
        .build(futures::stream::iter(Vec::<Result<RecordBatch, _>>::new()));
    let refused = bounded(async {
        let results = f.flight.do_put(data).await?;
        results.try_collect::<Vec<_>>().await
    })
    .await
    .unwrap_err();
    let (got, message) = code(refused);
    assert_eq!(got, Code::InvalidArgument, "{message}");
    assert!(message.contains("read-only"), "{message}");
    assert_eq!(f.counts().await, (1, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peek_sets_the_size_of_one_query_and_bad_arguments_are_refused() {
    let f = Fixture::standard(8).await;
    let mut sql = sql_client(&f.server.url).await;
    let count = async |sql: &mut FlightSqlServiceClient<Channel>, q: &str| {
        let info = bounded(sql.execute(q.into(), None)).await.unwrap();
        let (_, batches) = fetch(sql, &info).await.unwrap();
        let n = batches[0].column(0);
        n.as_any()
            .downcast_ref::<arrow_array::Int64Array>()
            .unwrap()
            .value(0)
    };
    // One partition of at most 3 messages, for this query only.
    assert_eq!(
        count(&mut sql, "SELECT count(*) FROM peek('t', 3, 1, 300)").await,
        3
    );
    assert_eq!(count(&mut sql, "SELECT count(*) FROM t").await, 8);
    assert_eq!(f.counts().await, (8, 0));
    let cases = [
        ("SELECT * FROM peek('nope', 3)", Code::NotFound, "nope"),
        (
            "SELECT * FROM peek('t')",
            Code::InvalidArgument,
            "peek(table, max_messages",
        ),
        (
            "SELECT * FROM peek(1, 3)",
            Code::InvalidArgument,
            "peek(table, max_messages",
        ),
        (
            "SELECT * FROM peek('t', 'many')",
            Code::InvalidArgument,
            "peek(table, max_messages",
        ),
        (
            "SELECT * FROM peek('t', 0)",
            Code::InvalidArgument,
            "max_messages",
        ),
        (
            "SELECT * FROM peek('t', 10, 100000)",
            Code::InvalidArgument,
            "partitions",
        ),
    ];
    for (q, want, text) in cases {
        // Argument errors come at planning; limits when the peek is planned
        // (DoGet), like a plan command's.
        let result = match bounded(sql.execute(q.into(), None)).await {
            Ok(info) => fetch(&mut sql, &info).await.map(|_| ()),
            Err(e) => Err(e),
        };
        let (got, message) = code(result.unwrap_err());
        assert_eq!(got, want, "{q}: {message}");
        assert!(message.contains(text), "{q}: {message}");
    }
    assert_eq!(f.counts().await, (8, 0), "refused peeks changed nothing");
}
