//! Flight SQL's catalog filter patterns have a length cap and their
//! results are built off the runtime: GetTables' and GetDbSchemas'
//! patterns over 1 KiB (`MAX_CATALOG_PATTERN_BYTES`) are INVALID_ARGUMENT
//! naming the cap, at GetFlightInfo and at DoGet, before anything is
//! compiled (megabyte patterns took seconds of a runtime thread and GiBs
//! each); a pattern at the cap still works; while many of the heaviest
//! patterns run, and while megabyte ones are refused, another client's
//! ListFlights answers at once. Against the real server binary on its demo
//! table.

use std::time::Duration;

use arrow_array::RecordBatch;
use arrow_flight::Ticket;
use arrow_flight::sql::client::FlightSqlServiceClient;
use arrow_flight::sql::{CommandGetDbSchemas, CommandGetTables, ProstMessageExt};
use futures::TryStreamExt;
use prost::Message;
use sqs_flight_tests::server_process::ServerProcess;
use tonic::Code;
use tonic::transport::Channel;

use sqs_flight_tests::flight_sql::{code, fetch, sql_client};
use sqs_flight_tests::prelude::*;

/// The server's cap on a pattern, in bytes.
const CAP: usize = sqs_flight_server::testing::MAX_CATALOG_PATTERN_BYTES;
/// Bound on another client's ListFlights while catalog calls run (it took
/// milliseconds when measured; the machine is shared).
const PROMPT: Duration = Duration::from_secs(3);
/// Catalog calls at once with the heaviest patterns at the cap (about
/// 100 ms of CPU each in a debug build).
const CALLS: usize = 32;
/// Calls at once with megabyte patterns (each took seconds and GiBs
/// before the cap: a few show the point).
const HUGE_CALLS: usize = 2;

/// The table names GetTables answers for `request`.
async fn tables(
    sql: &mut FlightSqlServiceClient<Channel>,
    request: CommandGetTables,
) -> Result<Vec<String>, (Code, String)> {
    let info = bounded(sql.get_tables(request)).await.map_err(code)?;
    let (_, batches) = fetch(sql, &info).await.map_err(code)?;
    Ok(texts(&batches, "table_name"))
}

/// DoGet of `command` as its own ticket (as a client that skips
/// GetFlightInfo sends it).
async fn do_get(url: &str, command: Vec<u8>) -> Result<usize, (Code, String)> {
    let mut sql = sql_client(url).await;
    let stream = bounded(sql.do_get(Ticket::new(command)))
        .await
        .map_err(code)?;
    let batches: Vec<RecordBatch> = bounded(stream.try_collect()).await.map_err(code)?;
    Ok(batches.iter().map(RecordBatch::num_rows).sum())
}

/// Another client's ListFlights answers within [`PROMPT`].
async fn list_flights_promptly(url: &str, during: &str) -> usize {
    list_flights_within(url, PROMPT, during).await
}

/// The refusal of a pattern over the cap: INVALID_ARGUMENT naming the
/// field, its size and the cap.
fn assert_refused(outcome: Result<impl std::fmt::Debug, (Code, String)>, field: &str, len: usize) {
    let (got, message) = outcome.expect_err("refused");
    assert_eq!(got, Code::InvalidArgument, "{message}");
    let size = format!("{field} is {len} bytes");
    assert!(
        message.contains(&size) && message.contains("MAX_CATALOG_PATTERN_BYTES"),
        "{message}"
    );
}

/// `n` copies of `call` at once, from clients of their own, while another
/// client's ListFlights must answer promptly, again and again until they
/// have all ended; their outcomes.
async fn at_once<T, F, Fut>(url: &str, n: usize, during: &str, call: F) -> Vec<T>
where
    F: Fn(String) -> Fut,
    Fut: Future<Output = T> + Send + 'static,
    T: Send + 'static,
{
    let calls: Vec<_> = (0..n)
        .map(|_| tokio::spawn(call(url.to_string())))
        .collect();
    loop {
        assert_eq!(list_flights_promptly(url, during).await, 1);
        if calls.iter().all(|c| c.is_finished()) {
            break;
        }
    }
    let mut out = Vec::new();
    for call in calls {
        out.push(bounded(call).await.expect("joined"));
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn catalog_patterns_over_the_cap_are_refused_and_heavy_ones_delay_no_one() {
    let mut server = ServerProcess::start(&["--listen", "127.0.0.1:0"]);
    let pid = server.pid();
    let url = server.url.clone();
    let mut sql = sql_client(&url).await;
    let all = tables(&mut sql, CommandGetTables::default()).await.unwrap();
    assert_eq!(all, ["demo"]);

    // Just over the cap, in each field, at GetFlightInfo and at DoGet.
    let over = "%".repeat(CAP + 1);
    let table = CommandGetTables {
        table_name_filter_pattern: Some(over.clone()),
        ..Default::default()
    };
    let schema = CommandGetTables {
        db_schema_filter_pattern: Some(over.clone()),
        ..Default::default()
    };
    let schemas = CommandGetDbSchemas {
        db_schema_filter_pattern: Some(over.clone()),
        ..Default::default()
    };
    let field = "table_name_filter_pattern";
    assert_refused(tables(&mut sql, table.clone()).await, field, CAP + 1);
    let ticket = table.as_any().encode_to_vec();
    assert_refused(do_get(&url, ticket).await, field, CAP + 1);
    let field = "db_schema_filter_pattern";
    assert_refused(tables(&mut sql, schema.clone()).await, field, CAP + 1);
    assert_refused(
        do_get(&url, schema.as_any().encode_to_vec()).await,
        field,
        CAP + 1,
    );
    let info = bounded(sql.get_db_schemas(schemas.clone()))
        .await
        .map_err(code);
    assert_refused(info, field, CAP + 1);
    assert_refused(
        do_get(&url, schemas.as_any().encode_to_vec()).await,
        field,
        CAP + 1,
    );

    // Megabyte patterns of wildcards (each compiled for seconds, taking
    // GiBs, before the cap), several at once: refused, and no one waits.
    let huge = "%_".repeat(1 << 19);
    let command = CommandGetTables {
        table_name_filter_pattern: Some(huge.clone()),
        ..Default::default()
    };
    let ticket = command.as_any().encode_to_vec();
    let during = "while 1 MiB patterns are refused";
    let refusals = at_once(&url, HUGE_CALLS, during, |url| {
        let ticket = ticket.clone();
        async move { do_get(&url, ticket).await }
    })
    .await;
    for refused in refusals {
        assert_refused(refused, "table_name_filter_pattern", huge.len());
    }

    // At the cap: still answered, and the heaviest patterns there, many at
    // once, delay no one.
    let at_cap = format!("d{}o", "%".repeat(CAP - 2));
    let found = tables(
        &mut sql,
        CommandGetTables {
            table_name_filter_pattern: Some(at_cap.clone()),
            db_schema_filter_pattern: Some(format!("p{}c", "%".repeat(CAP - 2))),
            ..Default::default()
        },
    )
    .await;
    assert_eq!(found.unwrap(), ["demo"], "a pattern at the cap works");
    let heavy = CommandGetTables {
        table_name_filter_pattern: Some("%_".repeat(CAP / 2)),
        db_schema_filter_pattern: Some("_%".repeat(CAP / 2)),
        ..Default::default()
    };
    let answers = at_once(&url, CALLS, "while patterns at the cap run", |url| {
        let request = heavy.clone();
        async move { tables(&mut sql_client(&url).await, request).await }
    })
    .await;
    for answer in answers {
        assert_eq!(answer.unwrap(), Vec::<String>::new(), "4 characters < 512");
    }

    // Nothing changed: the same server, the same tables and flights.
    assert!(
        server.exited().is_none(),
        "the server exited:\n{}",
        server.log()
    );
    assert_eq!(server.pid(), pid);
    assert_eq!(
        tables(&mut sql, CommandGetTables::default()).await.unwrap(),
        all
    );
    assert_eq!(list_flights_promptly(&url, "after").await, 1);
}
