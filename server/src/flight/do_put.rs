//! DoPut: record batches of PATH `[table]` become SQS messages.

use std::sync::Arc;

use arrow_flight::decode::FlightRecordBatchStream;
use arrow_flight::error::FlightError;
use arrow_flight::flight_descriptor::DescriptorType;
use arrow_flight::{FlightData, PutResult};
use futures::{Stream, StreamExt, TryStreamExt, stream};
use serde_json::json;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Status, Streaming};

use crate::error::{Error, Result};
use crate::registry::{Registry, Table};
use crate::write::{WriteError, rows, send};

type PutStream = std::pin::Pin<Box<dyn Stream<Item = Result<PutResult, Status>> + Send>>;

/// Starts a DoPut: reads the descriptor, then sends batch after batch,
/// answering one PutResult `{"sent": n}` per batch.
pub async fn do_put(registry: &Registry, mut input: Streaming<FlightData>) -> Result<PutStream> {
    let first = input
        .message()
        .await
        .map_err(|s| Error::InvalidArgument(format!("reading the DoPut stream: {}", s.message())))?
        .ok_or_else(|| Error::InvalidArgument("DoPut stream is empty".into()))?;
    let table = Arc::clone(registry.table(&table_of(&first)?)?);
    let data = stream::once(async { Ok(first) })
        .chain(input)
        .map_err(|s| FlightError::Tonic(Box::new(s)));
    let batches = FlightRecordBatchStream::new_from_flight_data(data);
    let (tx, rx) = mpsc::channel(1);
    tokio::spawn(async move {
        if let Err(e) = write(&table, batches, &tx).await {
            let _ = tx.send(Err(e.into())).await;
        }
    });
    Ok(Box::pin(ReceiverStream::new(rx)))
}

fn table_of(first: &FlightData) -> Result<String> {
    let descriptor = first.flight_descriptor.as_ref().ok_or_else(|| {
        Error::InvalidArgument("DoPut needs a PATH [table] descriptor on its first message".into())
    })?;
    match (
        DescriptorType::try_from(descriptor.r#type),
        descriptor.path.as_slice(),
    ) {
        (Ok(DescriptorType::Path), [table]) => Ok(table.clone()),
        _ => Err(Error::InvalidArgument(
            "DoPut descriptor must be PATH [table]".into(),
        )),
    }
}

async fn write(
    table: &Table,
    mut batches: FlightRecordBatchStream,
    results: &mpsc::Sender<Result<PutResult, Status>>,
) -> Result<()> {
    let fifo = table.queue.is_fifo();
    let mut rows_seen = 0u64;
    let mut sent = 0u64;
    let fail = |sent: u64, source: WriteError| Error::Write {
        table: table.name().to_string(),
        sent,
        source,
    };
    while let Some(batch) = batches.next().await {
        let batch = batch.map_err(|e| {
            fail(
                sent,
                WriteError::Schema(format!("DoPut: not a valid Arrow stream: {e}")),
            )
        })?;
        rows::check_schema(&batch.schema()).map_err(|e| fail(sent, e))?;
        let (messages, bad_row) =
            rows::messages(&batch, rows_seen, fifo).map_err(|e| fail(sent, e))?;
        rows_seen += batch.num_rows() as u64;
        let (n, error) = send::send_all(
            table.queue.as_ref(),
            messages,
            rows_seen - batch.num_rows() as u64,
        )
        .await;
        sent += n;
        if let Some(e) = error.or(bad_row) {
            return Err(fail(sent, e));
        }
        let metadata = json!({ "sent": n }).to_string();
        let result = PutResult {
            app_metadata: metadata.into_bytes().into(),
        };
        if results.send(Ok(result)).await.is_err() {
            break; // the client hung up
        }
    }
    tracing::info!(table = %table.name(), rows = rows_seen, sent, "DoPut finished");
    Ok(())
}
