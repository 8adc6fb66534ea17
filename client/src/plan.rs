//! Planning a batch: the options sent with GetFlightInfo and the plan that
//! comes back.

use std::time::Duration;

use arrow_flight::{FlightInfo, Ticket};
use arrow_schema::SchemaRef;
use serde::Deserialize;
use sqs_flight_schemas::PlanCommand;
use sqs_flight_schemas::command::DEFAULT_CONSUMER;
use sqs_flight_schemas::plan::PlanValue;

use crate::error::{Error, Result};

/// Makes [`PlanOptions`]: the consumer, the batch, and a field and a
/// setter for each plan parameter of `plan_params!`.
macro_rules! plan_options {
    (
        $(
            $(#[doc = $doc:literal])*
            $name:ident {
                default: $default_name:ident = $default:expr,
                limit: $limit_name:ident = $limit:expr,
                zero: $zero:literal,
                limit_flag: $flag:literal, $env:literal, $value_name:literal {
                    $(#[doc = $flag_doc:literal])*
                },
                spark: $spark:literal,
                client: $client:ident: $client_ty:ty,
                cli: [$({ $(#[doc = $cli_doc:literal])* })?],
            }
        )*
    ) => {
        /// What to plan. Every field left `None` takes the server's value: the
        /// consumer's next batch and the table's configured limits.
        ///
        /// ```
        /// use std::time::Duration;
        /// use sqs_flight_client::PlanOptions;
        ///
        /// let options = PlanOptions::consumer("reports")
        ///     .partitions(4)
        ///     .max_messages(500)
        ///     .max_wait(Duration::from_millis(200));
        /// let cmd = options.command("orders");
        /// assert_eq!(cmd.consumer, "reports");
        /// assert_eq!(cmd.max_wait_ms, Some(200));
        /// ```
        #[derive(Debug, Clone, Default, PartialEq, Eq)]
        pub struct PlanOptions {
            /// The consumer whose batch this is (default: `default`).
            pub consumer: Option<String>,
            /// The batch number; `None` plans the consumer's next batch.
            pub batch: Option<u64>,
            $(
                #[doc = concat!("`", stringify!($name), "`:")]
                $(#[doc = $doc])*
                pub $client: Option<$client_ty>,
            )*
        }

        impl PlanOptions {
            $(
                #[doc = concat!("Sets `", stringify!($name), "`.")]
                pub fn $client(mut self, $client: $client_ty) -> Self {
                    self.$client = Some($client);
                    self
                }
            )*

            /// The GetFlightInfo command for `table`.
            pub fn command(&self, table: &str) -> PlanCommand {
                PlanCommand {
                    table: table.to_string(),
                    consumer: self.consumer_name().to_string(),
                    batch: self.batch,
                    $( $name: self.$client.map(PlanValue::plan_value), )*
                }
            }
        }
    };
}

sqs_flight_schemas::plan_params!(plan_options);

impl PlanOptions {
    /// Options for the next batch of `consumer`.
    pub fn consumer(consumer: impl Into<String>) -> Self {
        Self {
            consumer: Some(consumer.into()),
            ..Self::default()
        }
    }

    /// Plans (or replays) batch `batch` instead of the next one.
    pub fn batch(mut self, batch: u64) -> Self {
        self.batch = Some(batch);
        self
    }

    /// The consumer these options name, or the protocol's default.
    pub fn consumer_name(&self) -> &str {
        self.consumer.as_deref().unwrap_or(DEFAULT_CONSUMER)
    }
}

/// One partition of a planned batch: a ticket to read with
/// [`Client::read`](crate::Client::read), as often as needed (every read of
/// a ticket returns the same rows until the batch is committed).
#[derive(Debug, Clone, PartialEq)]
pub struct Endpoint {
    /// The partition's index in the plan, from 0.
    pub partition: usize,
    /// Opaque bytes; pass them back unchanged.
    pub ticket: Ticket,
    /// The locations the server advertised for this ticket.
    pub locations: Vec<String>,
}

/// A planned batch: which batch the server assigned, and its endpoints.
#[derive(Debug, Clone)]
pub struct Plan {
    pub table: String,
    pub consumer: String,
    pub batch: u64,
    pub schema: SchemaRef,
    pub endpoints: Vec<Endpoint>,
}

/// GetFlightInfo's `app_metadata`: `{"table","consumer","batch"}`.
#[derive(Deserialize)]
struct PlanMetadata {
    table: String,
    consumer: String,
    batch: u64,
}

impl Plan {
    /// Reads a plan out of GetFlightInfo's answer.
    pub fn from_flight_info(info: &FlightInfo) -> Result<Self> {
        let what = "GetFlightInfo";
        let meta: PlanMetadata = serde_json::from_slice(&info.app_metadata).map_err(|e| {
            Error::protocol(what, format!("app_metadata is not the plan JSON: {e}"))
        })?;
        let schema = info
            .clone()
            .try_decode_schema()
            .map_err(|e| Error::protocol(what, format!("schema: {e}")))?;
        let endpoints = info
            .endpoint
            .iter()
            .enumerate()
            .map(|(partition, e)| {
                let ticket = e.ticket.clone().ok_or_else(|| {
                    Error::protocol(what, format!("endpoint {partition} has no ticket"))
                })?;
                let locations = e.location.iter().map(|l| l.uri.clone()).collect();
                Ok(Endpoint {
                    partition,
                    ticket,
                    locations,
                })
            })
            .collect::<Result<_>>()?;
        Ok(Self {
            table: meta.table,
            consumer: meta.consumer,
            batch: meta.batch,
            schema: std::sync::Arc::new(schema),
            endpoints,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_flight::FlightEndpoint;
    use sqs_flight_schemas::table_schema;

    #[test]
    fn options_become_the_plan_command() {
        let cmd = PlanOptions::default().command("t");
        assert_eq!(cmd, PlanCommand::new("t", "default"));
        let cmd = PlanOptions::consumer("c")
            .batch(7)
            .partitions(3)
            .max_messages(10)
            .max_wait(Duration::from_millis(250))
            .max_bytes(1024)
            .max_duration(Duration::from_secs(2))
            .command("t");
        let json: serde_json::Value = serde_json::from_slice(&cmd.to_json()).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"table": "t", "consumer": "c", "batch": 7, "partitions": 3,
                "max_messages": 10, "max_wait_ms": 250, "max_bytes": 1024, "max_duration_ms": 2000})
        );
    }

    fn info(metadata: &str, tickets: &[Option<&str>]) -> FlightInfo {
        let endpoints = tickets
            .iter()
            .map(|t| {
                let e = FlightEndpoint::new().with_location("grpc://h:1");
                match t {
                    Some(t) => e.with_ticket(Ticket::new(t.to_string())),
                    None => e,
                }
            })
            .collect();
        FlightInfo::new()
            .try_with_schema(&table_schema())
            .unwrap()
            .with_endpoints(endpoints)
            .with_app_metadata(metadata.as_bytes().to_vec())
    }

    #[test]
    fn plan_from_flight_info() {
        let i = info(
            r#"{"table":"t","consumer":"c","batch":4}"#,
            &[Some("a"), Some("b")],
        );
        let plan = Plan::from_flight_info(&i).unwrap();
        assert_eq!(
            (plan.table.as_str(), plan.consumer.as_str(), plan.batch),
            ("t", "c", 4)
        );
        assert_eq!(plan.schema, table_schema());
        assert_eq!(plan.endpoints.len(), 2);
        assert_eq!(plan.endpoints[1].partition, 1);
        assert_eq!(plan.endpoints[1].ticket.ticket.as_ref(), b"b");
        assert_eq!(plan.endpoints[0].locations, ["grpc://h:1"]);
    }

    #[test]
    fn malformed_plans_are_protocol_errors() {
        let bad_meta = info("{}", &[Some("a")]);
        let e = Plan::from_flight_info(&bad_meta).unwrap_err();
        assert!(e.to_string().contains("app_metadata"), "{e}");
        let no_ticket = info(r#"{"table":"t","consumer":"c","batch":1}"#, &[None]);
        let e = Plan::from_flight_info(&no_ticket).unwrap_err();
        assert!(e.to_string().contains("no ticket"), "{e}");
    }
}
