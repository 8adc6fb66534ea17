//! DoGet: stream a ticket's rows, receiving them first if nobody has.

use std::sync::Arc;
use std::time::Instant;

use arrow_array::RecordBatch;
use arrow_flight::encode::FlightDataEncoderBuilder;
use arrow_flight::error::FlightError;
use arrow_flight::{FlightData, Ticket};
use futures::{Stream, StreamExt, TryStreamExt, stream};
use sqs_flight_schemas::TicketId;
use tokio::task::JoinHandle;
use tokio_util::sync::{CancellationToken, DropGuard};
use tonic::Status;

use crate::error::{Error, Result};
use crate::metrics::{Metrics, OpenStream};
use crate::registry::Registry;
use crate::registry::receive::{ReceiveSummary, Receiver};
use crate::registry::ticket::{Begin, Ticket as RegistryTicket};

type DoGetStream = std::pin::Pin<Box<dyn Stream<Item = Result<FlightData, Status>> + Send>>;

/// Starts the stream of one ticket.
pub fn do_get(
    registry: &Arc<Registry>,
    ticket: &Ticket,
    shutdown: &CancellationToken,
) -> Result<DoGetStream> {
    let id = TicketId::decode(&ticket.ticket)?;
    let (table, batch, ticket) = registry.ticket(&id)?;
    let schema = table.schema();
    let begin = ticket.begin();
    let receiving = begin.first.then(|| {
        let cancel = shutdown.child_token();
        let receiver = Receiver {
            registry: Arc::clone(registry),
            table,
            batch,
            ticket: Arc::clone(&ticket),
            cancel: cancel.clone(),
        };
        Receiving {
            task: tokio::spawn(receiver.run()),
            _stop_on_drop: cancel.drop_guard(),
        }
    });
    let rows = rows(ticket, begin, receiving, Arc::clone(&registry.metrics))
        .map_err(|e| FlightError::Tonic(Box::new(e.into())));
    let flight = FlightDataEncoderBuilder::new()
        .with_schema(schema)
        .build(rows)
        .map_err(flight_status);
    Ok(Box::pin(flight))
}

/// The receive task of a first read. Dropping it (the client hung up)
/// cancels the receive at once.
struct Receiving {
    task: JoinHandle<Result<ReceiveSummary>>,
    _stop_on_drop: DropGuard,
}

/// Logs one line per stream when it ends, however it ends.
struct StreamSummary {
    open: OpenStream,
    ticket: Arc<RegistryTicket>,
    replay: bool,
    rows: u64,
    started: Instant,
}

impl Drop for StreamSummary {
    fn drop(&mut self) {
        let id = &self.ticket.id;
        tracing::info!(table = %id.table, consumer = %id.consumer, batch = id.batch,
            partition = id.partition, rows = self.rows, replay = self.replay,
            duration_ms = self.started.elapsed().as_millis() as u64, "DoGet stream ended");
        if self.replay {
            Metrics::count(&self.open.0.replayed, &id.table, &id.consumer, self.rows);
        }
    }
}

/// The ticket's rows, then the receive task's error, if it failed.
fn rows(
    ticket: Arc<RegistryTicket>,
    begin: Begin,
    receiving: Option<Receiving>,
    metrics: Arc<Metrics>,
) -> impl Stream<Item = Result<RecordBatch>> + Send {
    let mut summary = StreamSummary {
        open: OpenStream::new(metrics),
        ticket: Arc::clone(&ticket),
        replay: receiving.is_none(),
        rows: 0,
        started: Instant::now(),
    };
    let batches = ticket.follow(begin).map(move |b| {
        if let Ok(b) = &b {
            summary.rows += b.num_rows() as u64;
        }
        let _ = &summary;
        b
    });
    let outcome = stream::once(async move {
        match receiving {
            None => None,
            Some(r) => match r.task.await {
                Ok(Ok(_summary)) => None,
                Ok(Err(e)) => Some(Err(e)),
                Err(join) => Some(Err(Error::Internal(format!("receive task failed: {join}")))),
            },
        }
    })
    .filter_map(|x| async move { x });
    batches.chain(outcome)
}

fn flight_status(e: FlightError) -> Status {
    match e {
        FlightError::Tonic(status) => *status,
        other => Status::internal(format!("encoding Flight data: {other}")),
    }
}
