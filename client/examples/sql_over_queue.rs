//! SQL over a queue with DataFusion: count and sum the demo table's order
//! events by type, then commit the batch the query read.
//!
//! Start a server with its embedded demo table, then run the example:
//!
//! ```text
//! sqs-flight-server --listen 127.0.0.1:50051 &
//! cargo run -p sqs-flight-client --example sql_over_queue -- grpc://127.0.0.1:50051 demo
//! ```
//!
//! Pass `--commit` as a third argument to delete what the query read;
//! without it the messages are released back to the queue.

use std::sync::Arc;

use sqs_flight_client::datafusion::{SqsFlightTable, session_context};
use sqs_flight_client::{Client, PlanOptions};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let url = args
        .next()
        .unwrap_or_else(|| "grpc://127.0.0.1:50051".into());
    let table = args.next().unwrap_or_else(|| "demo".into());
    let commit = args.next().as_deref() == Some("--commit");

    let client = Client::connect(&url).await?;
    // One batch of consumer `sql-example`: every query through this provider
    // reads the same messages until it commits or releases.
    let options = PlanOptions::consumer("sql-example").partitions(2);
    let orders = Arc::new(SqsFlightTable::try_new(client, &table, options).await?);

    let ctx = session_context()?;
    ctx.register_table("orders", orders.clone())?;
    let query = "
        SELECT json_get_str(body, 'event')          AS event,
               count(*)                             AS messages,
               sum(json_get_int(body, 'amount_cents')) AS amount_cents
        FROM orders
        GROUP BY 1
        ORDER BY 1";
    ctx.sql(query).await?.show().await?;

    if commit {
        let committed = orders.commit().await?;
        println!("committed: {committed:?}");
    } else {
        let released = orders.release().await?;
        println!("released: {released:?}");
    }
    Ok(())
}
