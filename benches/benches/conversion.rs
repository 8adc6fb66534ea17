//! Figure 1: SQS message -> Arrow conversion, messages/s and MB/s per core.
//!
//! Each iteration converts 1000 messages in record batches of 10 rows (one
//! per ReceiveMessage, as the server builds them) or of 1000 rows, with
//! 256 B and 4 KiB bodies, beside a baseline that does only the
//! unavoidable work:
//!
//! - `table_rows` (ours: [`MessageBatchBuilder`], every column of the table)
//!   against `id_body_only` (a StringArray of ids and one of bodies);
//! - `table_rows_payload` (ours, plus [`PayloadDecoder::extend`]) against
//!   `arrow_json_only` (arrow-json decoding the same bodies, nothing else).
//!
//! `sqs-flight-bench criterion-summary` turns criterion's output into the
//! results file.

use std::hint::black_box;
use std::time::Duration;

use arrow_array::builder::StringBuilder;
use arrow_json::ReaderBuilder;
use arrow_schema::{DataType, Field, Schema};
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use sqs_flight_schemas::payload::{FieldSpec, PayloadDecoder, PayloadSpec, Unwrap};
use sqs_flight_schemas::{MessageBatchBuilder, SqsMessage, table_schema};

/// Messages per iteration.
const MESSAGES: usize = 1000;

fn body(n: usize, size: usize) -> String {
    let head = format!("{{\"n\":{n},\"pad\":\"");
    let pad = size.saturating_sub(head.len() + 2);
    format!("{head}{}\"}}", "x".repeat(pad))
}

/// A message as the server gets it from SQS (no attributes).
fn message(n: usize, size: usize) -> SqsMessage {
    SqsMessage {
        message_id: format!("{n:08x}-2f1c-4b8e-9d3a-5c7e1f2a9b40"),
        body: body(n, size),
        md5_of_body: Some("9e107d9d372bb6826bd81d3542a419d6".into()),
        sent_timestamp: Some(1_764_460_800_000 + n as i64),
        first_receive_timestamp: Some(1_764_460_800_500 + n as i64),
        receive_count: Some(1),
        sender_id: Some("AIDAIT2UOQQY3AUEKVGXU".into()),
        ..SqsMessage::default()
    }
}

fn spec() -> PayloadSpec {
    let field = |name: &str, ty: &str| FieldSpec {
        name: name.into(),
        ty: ty.into(),
        nullable: true,
        fields: None,
        item: None,
        unit: None,
        timezone: None,
    };
    PayloadSpec {
        unwrap: Unwrap::None,
        fields: vec![field("n", "int64"), field("pad", "utf8")],
    }
}

fn bench(c: &mut Criterion) {
    let decoder = PayloadDecoder::new(&spec(), &table_schema()).expect("a valid payload spec");
    let payload_schema = std::sync::Arc::new(Schema::new(vec![
        Field::new("n", DataType::Int64, true),
        Field::new("pad", DataType::Utf8, true),
    ]));
    for size in [256usize, 4096] {
        let msgs: Vec<SqsMessage> = (0..MESSAGES).map(|n| message(n, size)).collect();
        let bytes: u64 = msgs.iter().map(|m| m.body.len() as u64).sum();
        for rows in [10usize, 1000] {
            let mut g = c.benchmark_group(format!("{size}B_{rows}rows"));
            g.throughput(Throughput::Bytes(bytes));
            g.bench_function(BenchmarkId::from_parameter("id_body_only"), |b| {
                b.iter(|| {
                    for chunk in msgs.chunks(rows) {
                        let mut ids = StringBuilder::with_capacity(rows, rows * 36);
                        let mut bodies = StringBuilder::with_capacity(rows, rows * size);
                        for m in chunk {
                            ids.append_value(&m.message_id);
                            bodies.append_value(&m.body);
                        }
                        black_box((ids.finish(), bodies.finish()));
                    }
                })
            });
            g.bench_function(BenchmarkId::from_parameter("table_rows"), |b| {
                b.iter(|| {
                    for chunk in msgs.chunks(rows) {
                        let mut builder = MessageBatchBuilder::with_capacity(chunk.len());
                        chunk.iter().for_each(|m| builder.append(m));
                        black_box(builder.finish(1, 0).expect("a batch"));
                    }
                })
            });
            g.bench_function(BenchmarkId::from_parameter("arrow_json_only"), |b| {
                b.iter(|| {
                    for chunk in msgs.chunks(rows) {
                        let mut d = ReaderBuilder::new(payload_schema.clone())
                            .with_batch_size(rows)
                            .build_decoder()
                            .expect("a decoder");
                        for m in chunk {
                            d.decode(m.body.as_bytes()).expect("JSON");
                            d.decode(b"\n").expect("JSON");
                        }
                        black_box(d.flush().expect("a batch"));
                    }
                })
            });
            g.bench_function(BenchmarkId::from_parameter("table_rows_payload"), |b| {
                b.iter(|| {
                    for chunk in msgs.chunks(rows) {
                        let mut builder = MessageBatchBuilder::with_capacity(chunk.len());
                        chunk.iter().for_each(|m| builder.append(m));
                        let batch = builder.finish(1, 0).expect("a batch");
                        black_box(decoder.extend(batch).expect("payload"));
                    }
                })
            });
            g.finish();
        }
    }
}

fn config() -> Criterion {
    Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .sample_size(20)
}

criterion_group! {
    name = benches;
    config = config();
    targets = bench
}
criterion_main!(benches);
