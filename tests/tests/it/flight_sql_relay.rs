//! The server relays a Flight SQL result as its worker encoded it, and
//! never expands it: a dictionary column goes out as a dictionary (sent
//! once, not hydrated to rows x value bytes), a view column is compacted
//! per message (not its every data buffer once per slice), a row or a
//! dictionary over one gRPC message is RESOURCE_EXHAUSTED naming the cap.
//! Against the real server binary on its demo table: its peak memory
//! hardly grows for a result that would take a GiB expanded, it keeps its
//! pid, and another client's ListFlights answers while the result streams.

use std::time::Duration;

use arrow_array::RecordBatch;
use arrow_array::cast::AsArray;
use arrow_flight::FlightInfo;
use arrow_flight::sql::client::FlightSqlServiceClient;
use arrow_schema::{DataType, Schema};
use futures::TryStreamExt;
use sqs_flight_tests::server_process::ServerProcess;
use sqs_flight_tests::server_process::status_kib;
use tonic::Code;
use tonic::transport::Channel;

use sqs_flight_tests::flight_sql::{code, info_schema, sql_client, ticket};
use sqs_flight_tests::prelude::*;

/// Bytes of the one value of the dictionary column.
const VALUE: usize = 256 << 10;
/// Rows of the dictionary column: 1 GiB once hydrated.
const ROWS: usize = 4000;
/// Bytes of each (distinct) value of the view column.
const VIEW_VALUE: usize = 20 << 10;
/// Rows of the view column: 39 MiB of values, in one data buffer.
const VIEW_ROWS: usize = 2000;
/// Most the server's peak memory may grow by over the test: an eighth of
/// the dictionary's hydrated size (measured: a few MiB).
const GROWTH_KIB: u64 = 128 << 10;
/// Bound on another client's ListFlights while a result streams (it took
/// milliseconds when measured; the machine is shared).
const PROMPT: Duration = Duration::from_secs(3);

/// `(VALUES (0), (1), ... (n-1))`.
fn values(n: usize) -> String {
    let rows: Vec<String> = (0..n).map(|i| format!("({i})")).collect();
    format!("(VALUES {})", rows.join(", "))
}

/// Another client's ListFlights answers within [`PROMPT`], listing the
/// demo table.
async fn list_flights_promptly(url: &str, during: &str) {
    let listed = list_flights_within(url, PROMPT, during).await;
    assert_eq!(listed, 1, "the demo table");
}

/// The server's peak memory grew by less than [`GROWTH_KIB`] since it used
/// `before` KiB.
fn assert_small_growth(pid: u32, before: u64, what: &str) {
    let peak = status_kib(pid, "VmHWM:");
    let grown = peak.saturating_sub(before);
    eprintln!("{what}: VmRSS {before} KiB before, VmHWM {peak} KiB after (+{grown} KiB)");
    assert!(
        grown < GROWTH_KIB,
        "{what}: the server's peak memory grew by {grown} KiB (at most {GROWTH_KIB})"
    );
}

/// Runs `query`: its FlightInfo, and the DoGet stream of its ticket.
async fn start(
    sql: &mut FlightSqlServiceClient<Channel>,
    query: String,
) -> (FlightInfo, arrow_flight::decode::FlightRecordBatchStream) {
    let info = bounded(sql.execute(query, None)).await.expect("plans");
    let stream = bounded(sql.do_get(ticket(&info))).await.expect("runs");
    (info, stream)
}

/// Reads `stream` to its end, handing each batch to `check`, while
/// another client's ListFlights answers after the first batch; the
/// stream's schema.
async fn drain(
    url: &str,
    mut stream: arrow_flight::decode::FlightRecordBatchStream,
    mut check: impl FnMut(&RecordBatch),
    during: &str,
) -> Schema {
    let first = bounded(stream.try_next()).await.expect("a batch");
    check(&first.expect("a first batch"));
    list_flights_promptly(url, during).await;
    while let Some(batch) = bounded(stream.try_next()).await.expect("a batch") {
        check(&batch);
    }
    stream.schema().expect("the schema").as_ref().clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dictionary_and_a_view_column_are_relayed_without_the_server_expanding_them() {
    let mut server = ServerProcess::start(&["--listen", "127.0.0.1:0"]);
    let pid = server.pid();
    let mut sql = sql_client(&server.url).await;
    // The server's first statement and its one-time allocations.
    let (_, warm) = start(&mut sql, "SELECT 1 AS one".into()).await;
    let _ = bounded(warm.try_collect::<Vec<_>>())
        .await
        .expect("SELECT 1");
    let before = status_kib(pid, "VmRSS:");

    // One 256 KiB value in 4,000 rows: 1 GiB hydrated.
    let query = format!(
        "SELECT arrow_cast(repeat('x', {VALUE}), 'Dictionary(Int32, LargeUtf8)') AS d \
         FROM {} v(n)",
        values(ROWS)
    );
    let (info, stream) = start(&mut sql, query).await;
    let (mut rows, mut dictionaries) = (0, 0);
    let check = |b: &RecordBatch| {
        rows += b.num_rows();
        if let Some(column) = b.column(0).as_any_dictionary_opt() {
            let values = column.values().as_string::<i64>();
            assert_eq!(values.value(0).len(), VALUE);
            dictionaries += b.num_rows();
        }
    };
    let schema = drain(&server.url, stream, check, "during the dictionary result").await;
    assert_small_growth(pid, before, "a dictionary of 256 KiB in 4,000 rows");
    assert_eq!(
        (rows, dictionaries),
        (ROWS, ROWS),
        "every row, in dictionaries"
    );
    let dictionary = DataType::Dictionary(Box::new(DataType::Int32), Box::new(DataType::LargeUtf8));
    assert_eq!(
        schema.field(0).data_type(),
        &dictionary,
        "sent as a dictionary"
    );
    assert_eq!(
        schema,
        info_schema(&info),
        "the DoGet schema is the FlightInfo's"
    );

    // 2,000 distinct values of 20 KiB, views into one 39 MiB buffer: a
    // slice sent as it is would carry the whole buffer.
    let query = format!(
        "SELECT arrow_cast(lpad(arrow_cast(n, 'Utf8'), {VIEW_VALUE}, '0'), 'Utf8View') AS v \
         FROM {} v(n)",
        values(VIEW_ROWS)
    );
    let (info, stream) = start(&mut sql, query).await;
    let mut seen = Vec::new();
    let check = |b: &RecordBatch| {
        let column = b.column(0).as_string_view();
        for value in column.iter() {
            let value = value.expect("a value");
            assert_eq!(value.len(), VIEW_VALUE);
            seen.push(value.trim_start_matches('0').parse::<usize>().unwrap_or(0));
        }
    };
    let schema = drain(&server.url, stream, check, "during the view result").await;
    assert_small_growth(pid, before, "a view column of 39 MiB");
    assert_eq!(seen, (0..VIEW_ROWS).collect::<Vec<_>>());
    assert_eq!(schema.field(0).data_type(), &DataType::Utf8View);
    assert_eq!(schema, info_schema(&info));

    assert!(
        server.exited().is_none(),
        "the server exited:\n{}",
        server.log()
    );
    assert_eq!(server.pid(), pid);
    list_flights_promptly(&server.url, "after the results").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_or_a_dictionary_over_a_message_is_resource_exhausted_and_the_server_runs_on() {
    let mut server = ServerProcess::start(&["--listen", "127.0.0.1:0"]);
    let pid = server.pid();
    let mut sql = sql_client(&server.url).await;
    let cases = [
        (
            "one dictionary",
            "SELECT arrow_cast(repeat('x', 70000000), 'Dictionary(Int32, LargeUtf8)') AS d",
        ),
        ("one result row", "SELECT repeat('x', 70000000) AS s"),
    ];
    for (what, query) in cases {
        let (_, stream) = start(&mut sql, query.into()).await;
        let failed = bounded(stream.try_collect::<Vec<_>>()).await.unwrap_err();
        let (got, message) = code(failed);
        assert_eq!(got, Code::ResourceExhausted, "{what}: {message}");
        assert!(
            message.contains(what) && message.contains("over the 64.0 MiB a message may carry"),
            "{what}: {message}"
        );
        assert!(
            server.exited().is_none(),
            "the server exited:\n{}",
            server.log()
        );
        assert_eq!(server.pid(), pid);
        list_flights_promptly(&server.url, &format!("after {what} too large")).await;
    }
}
