//! DoGet: stream a ticket's rows, receiving them first if nobody has.

use std::sync::Arc;

use arrow_flight::encode::{DictionaryHandling, FlightDataEncoderBuilder};
use arrow_flight::error::FlightError;
use arrow_flight::{FlightData, Ticket};
use arrow_ipc::MetadataVersion;
use arrow_ipc::writer::IpcWriteOptions;
use futures::{Stream, TryStreamExt};
use sqs_flight_schemas::TicketId;
use tokio_util::sync::CancellationToken;
use tonic::Status;

use crate::error::Result;
use crate::registry::Registry;

type DoGetStream = std::pin::Pin<Box<dyn Stream<Item = Result<FlightData, Status>> + Send>>;

/// Starts the stream of one ticket.
pub(crate) fn do_get(
    registry: &Arc<Registry>,
    ticket: &Ticket,
    shutdown: &CancellationToken,
) -> Result<DoGetStream> {
    let id = TicketId::decode(&ticket.ticket)?;
    let schema = registry.ticket(&id)?.0.schema();
    let rows = registry
        .read(&id, shutdown)?
        .map_err(|e| FlightError::Tonic(Box::new(e.into())));
    let flight = encoder()
        .with_schema(schema)
        .build(rows)
        .map_err(flight_status);
    Ok(Box::pin(flight))
}

/// The Flight encoder of DoGet streams.
///
/// - Dictionaries are sent as they are: the table schema has none, and
///   the default (`Hydrate`) casts every column of every batch to its own
///   type, a copy of each array's metadata per batch for nothing.
/// - Buffers are aligned to 8 bytes, what the IPC format requires and
///   Arrow C++ (pyarrow) writes, instead of 64: a receive of ten rows has
///   about 35 buffers, so 64-byte padding added up to a quarter of a small
///   message.
pub fn encoder() -> FlightDataEncoderBuilder {
    let options = IpcWriteOptions::try_new(8, false, MetadataVersion::V5).unwrap_or_default();
    FlightDataEncoderBuilder::new()
        .with_options(options)
        .with_dictionary_handling(DictionaryHandling::Resend)
}

fn flight_status(e: FlightError) -> Status {
    match e {
        FlightError::Tonic(status) => *status,
        other => crate::error::internal(format!("encoding Flight data: {other}")),
    }
}
