//! Flight SQL calls of the tests, through arrow-flight's Flight SQL client.

use arrow_array::RecordBatch;
use arrow_flight::sql::client::FlightSqlServiceClient;
use arrow_flight::{FlightInfo, Ticket};
use arrow_schema::Schema;
use futures::TryStreamExt;
use tonic::Code;
use tonic::transport::Channel;

use crate::fixture::bounded;

/// A Flight SQL client on a plain `grpc://` URL.
pub async fn sql_client(url: &str) -> FlightSqlServiceClient<Channel> {
    let channel = tonic::transport::Endpoint::from_shared(url.replace("grpc://", "http://"))
        .expect("a valid URL")
        .connect()
        .await
        .expect("connect");
    FlightSqlServiceClient::new(channel)
}

/// The schema a Flight SQL FlightInfo announces.
pub fn info_schema(info: &FlightInfo) -> Schema {
    info.clone()
        .try_decode_schema()
        .expect("a schema in the FlightInfo")
}

/// The one ticket of a Flight SQL FlightInfo.
pub fn ticket(info: &FlightInfo) -> Ticket {
    assert_eq!(info.endpoint.len(), 1, "{info:?}");
    info.endpoint[0].ticket.clone().expect("a ticket")
}

/// DoGet of `info`'s ticket: the stream's schema and batches.
pub async fn fetch(
    client: &mut FlightSqlServiceClient<Channel>,
    info: &FlightInfo,
) -> Result<(Schema, Vec<RecordBatch>), arrow_flight::error::FlightError> {
    let mut stream = bounded(client.do_get(ticket(info))).await?;
    let mut batches = Vec::new();
    while let Some(b) = bounded(stream.try_next()).await? {
        batches.push(b);
    }
    let schema = stream
        .schema()
        .map(|s| s.as_ref().clone())
        .expect("the stream sent its schema");
    Ok((schema, batches))
}

/// The code and message of a Flight SQL call's status.
pub fn code(e: arrow_flight::error::FlightError) -> (Code, String) {
    match e {
        arrow_flight::error::FlightError::Tonic(s) => (s.code(), s.message().to_string()),
        other => panic!("not a status: {other}"),
    }
}
