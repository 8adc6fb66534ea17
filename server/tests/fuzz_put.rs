//! Property tests of DoPut's validation (`write::rows`): arbitrary Arrow
//! batches, of allowed and refused columns and types, with arbitrary
//! values, never panic; every refusal names its column or row; every
//! accepted row is one SQS takes, carried over unchanged.
//!
//! `PROPTEST_CASES=N` runs N cases per property (default 256);
//! `PROPTEST_RNG_SEED=S` replays a run.

use std::sync::Arc;

use arrow_array::builder::{
    Int32Builder, MapBuilder, MapFieldNames, StringBuilder, StringViewBuilder,
};
use arrow_array::{
    ArrayRef, BinaryArray, Float64Array, Int8Array, Int32Array, Int64Array, LargeStringArray,
    RecordBatch, StringArray, UInt64Array,
};
use arrow_schema::{Field, Schema};
use proptest::prelude::*;
use sqs_flight_server::sqs::OutgoingMessage;
use sqs_flight_server::testing::WriteError;
use sqs_flight_server::testing::rows::{self, MAX_MESSAGE_BYTES};

#[path = "../../tests/src/proptest_cases.rs"]
mod proptest_cases;
use proptest_cases::cases;

/// A row's attributes: (name, value), a null value as `None`.
type AttrList = Vec<(String, Option<String>)>;

/// One input row, in plain Rust types.
#[derive(Debug, Clone)]
struct Row {
    body: Option<String>,
    group: Option<String>,
    dedup: Option<String>,
    delay: Option<i64>,
    attrs: Option<AttrList>,
}

/// How a text column is encoded.
#[derive(Debug, Clone, Copy)]
enum Text {
    Utf8,
    Large,
    View,
    Binary, // refused
    Int32,  // refused
}

/// How `delay_seconds` is encoded.
#[derive(Debug, Clone, Copy)]
enum Int {
    I8,
    I32,
    I64,
    U64,
    F64,  // refused
    Utf8, // refused
}

/// How `message_attributes` is encoded.
#[derive(Debug, Clone, Copy)]
enum Attrs {
    Map,
    MapOtherNames, // same types, other field names: cast
    MapIntValues,  // cast: values become text
    Utf8,          // refused
}

#[derive(Debug, Clone)]
struct Layout {
    body: Option<Text>,
    group: Option<Text>,
    dedup: Option<Text>,
    delay: Option<Int>,
    attrs: Option<Attrs>,
    extra: Option<String>,
}

fn text_kind() -> impl Strategy<Value = Text> {
    prop_oneof![
        4 => Just(Text::Utf8),
        2 => Just(Text::Large),
        2 => Just(Text::View),
        1 => Just(Text::Binary),
        1 => Just(Text::Int32),
    ]
}

fn layout() -> impl Strategy<Value = Layout> {
    (
        prop_oneof![9 => text_kind().prop_map(Some), 1 => Just(None)],
        proptest::option::of(text_kind()),
        proptest::option::of(text_kind()),
        proptest::option::of(prop_oneof![
            3 => Just(Int::I64),
            2 => Just(Int::I32),
            1 => Just(Int::I8),
            2 => Just(Int::U64),
            1 => Just(Int::F64),
            1 => Just(Int::Utf8),
        ]),
        proptest::option::of(prop_oneof![
            5 => Just(Attrs::Map),
            1 => Just(Attrs::MapOtherNames),
            1 => Just(Attrs::MapIntValues),
            1 => Just(Attrs::Utf8),
        ]),
        prop_oneof![
            9 => Just(None),
            1 => prop_oneof![Just("Body".to_string()), Just("extra".into()), Just("message_id".into())]
                .prop_map(Some),
        ],
    )
        .prop_map(|(body, group, dedup, delay, attrs, extra)| Layout {
            body,
            group,
            dedup,
            delay,
            attrs,
            extra,
        })
}

/// Text SQS may or may not accept: plain, empty, control characters,
/// surrogates' neighbours, and sizes around the 1 MiB limit.
fn body() -> impl Strategy<Value = Option<String>> {
    prop_oneof![
        6 => "\\PC{1,20}".prop_map(Some),
        1 => Just(Some(String::new())),
        1 => Just(None),
        2 => ".{1,10}".prop_map(Some),
        1 => "[a-z]{0,3}[\\x00-\\x08\\x0b\\x0c\\x0e-\\x1f\\u{fffe}\\u{ffff}][a-z]{0,3}".prop_map(Some),
        1 => (MAX_MESSAGE_BYTES - 2..=MAX_MESSAGE_BYTES + 2).prop_map(|n| Some("x".repeat(n))),
    ]
}

fn id() -> impl Strategy<Value = Option<String>> {
    prop_oneof![
        4 => Just(None),
        4 => "[A-Za-z0-9!-/:-@]{1,20}".prop_map(Some),
        1 => Just(Some(String::new())),
        1 => ".{1,8}".prop_map(Some),
        1 => (126usize..=130).prop_map(|n| Some("g".repeat(n))),
    ]
}

fn delay() -> impl Strategy<Value = Option<i64>> {
    prop_oneof![
        3 => Just(None),
        4 => (0i64..=900).prop_map(Some),
        1 => (-5i64..0).prop_map(Some),
        1 => (901i64..2000).prop_map(Some),
        1 => any::<i64>().prop_map(Some),
        1 => prop_oneof![Just(i64::MIN), Just(i64::MAX), Just(1i64 << 32), Just(-1)].prop_map(Some),
    ]
}

fn attr_name() -> impl Strategy<Value = String> {
    prop_oneof![
        6 => "[A-Za-z0-9_-][A-Za-z0-9_.-]{0,10}[A-Za-z0-9_-]?",
        1 => Just(String::new()),
        1 => Just("AWS.x".to_string()),
        1 => Just("amazon.y".to_string()),
        1 => Just("a..b".to_string()),
        1 => Just(".a".to_string()),
        1 => ".{1,6}",
        1 => (255usize..=258).prop_map(|n| "n".repeat(n)),
    ]
}

fn attr_entry() -> impl Strategy<Value = (String, Option<String>)> {
    (
        attr_name(),
        prop_oneof![
            6 => "\\PC{1,8}".prop_map(Some),
            1 => Just(None),
            1 => Just(Some(String::new())),
            1 => "[a-z]{0,2}[\\x00-\\x08][a-z]{0,2}".prop_map(Some),
        ],
    )
}

fn attrs() -> impl Strategy<Value = Option<AttrList>> {
    prop_oneof![
        2 => Just(None),
        6 => proptest::collection::vec(attr_entry(), 0..4).prop_map(Some),
        1 => proptest::collection::vec(attr_entry(), 9..13).prop_map(Some),
        1 => Just(Some(vec![("k".to_string(), Some("1".to_string())), ("k".to_string(), Some("2".to_string()))])),
    ]
}

fn row() -> impl Strategy<Value = Row> {
    (body(), id(), id(), delay(), attrs()).prop_map(|(body, group, dedup, delay, attrs)| Row {
        body,
        group,
        dedup,
        delay,
        attrs,
    })
}

fn text_column(kind: Text, values: Vec<Option<String>>) -> ArrayRef {
    match kind {
        Text::Utf8 => Arc::new(StringArray::from(values)),
        Text::Large => Arc::new(LargeStringArray::from(values)),
        Text::View => {
            let mut b = StringViewBuilder::new();
            for v in values {
                b.append_option(v);
            }
            Arc::new(b.finish())
        }
        Text::Binary => Arc::new(BinaryArray::from(
            values
                .iter()
                .map(|v| v.as_deref().map(str::as_bytes))
                .collect::<Vec<_>>(),
        )),
        Text::Int32 => Arc::new(Int32Array::from(
            values
                .iter()
                .map(|v| v.as_ref().map(|s| s.len() as i32))
                .collect::<Vec<_>>(),
        )),
    }
}

/// The value `delay_seconds` holds once encoded as `kind`.
fn encoded_delay(kind: Int, v: i64) -> i128 {
    match kind {
        Int::I8 => (v as i8).into(),
        Int::I32 => (v as i32).into(),
        Int::U64 => (v as u64).into(),
        _ => v.into(),
    }
}

fn delay_column(kind: Int, values: Vec<Option<i64>>) -> ArrayRef {
    let it = values.into_iter();
    match kind {
        Int::I8 => Arc::new(it.map(|v| v.map(|v| v as i8)).collect::<Int8Array>()),
        Int::I32 => Arc::new(it.map(|v| v.map(|v| v as i32)).collect::<Int32Array>()),
        Int::I64 => Arc::new(it.collect::<Int64Array>()),
        Int::U64 => Arc::new(it.map(|v| v.map(|v| v as u64)).collect::<UInt64Array>()),
        Int::F64 => Arc::new(it.map(|v| v.map(|v| v as f64)).collect::<Float64Array>()),
        Int::Utf8 => Arc::new(StringArray::from(
            it.map(|v| v.map(|v| v.to_string())).collect::<Vec<_>>(),
        )),
    }
}

fn attrs_column(kind: Attrs, values: &[Option<AttrList>]) -> ArrayRef {
    match kind {
        Attrs::Map | Attrs::MapOtherNames => {
            let names = match kind {
                Attrs::Map => None,
                _ => Some(MapFieldNames {
                    entry: "kv".into(),
                    key: "k".into(),
                    value: "v".into(),
                }),
            };
            let mut b = MapBuilder::new(names, StringBuilder::new(), StringBuilder::new());
            for v in values {
                match v {
                    None => b.append(false).unwrap(),
                    Some(entries) => {
                        for (k, v) in entries {
                            b.keys().append_value(k);
                            b.values().append_option(v.as_deref());
                        }
                        b.append(true).unwrap();
                    }
                }
            }
            Arc::new(b.finish())
        }
        Attrs::MapIntValues => {
            let mut b = MapBuilder::new(None, StringBuilder::new(), Int32Builder::new());
            for v in values {
                match v {
                    None => b.append(false).unwrap(),
                    Some(entries) => {
                        for (k, v) in entries {
                            b.keys().append_value(k);
                            b.values().append_option(v.as_ref().map(|s| s.len() as i32));
                        }
                        b.append(true).unwrap();
                    }
                }
            }
            Arc::new(b.finish())
        }
        Attrs::Utf8 => Arc::new(StringArray::from(
            values
                .iter()
                .map(|v| v.as_ref().map(|e| format!("{e:?}")))
                .collect::<Vec<_>>(),
        )),
    }
}

fn batch(layout: &Layout, rows: &[Row]) -> RecordBatch {
    let mut columns: Vec<(String, ArrayRef)> = Vec::new();
    let texts = |f: fn(&Row) -> Option<String>| rows.iter().map(f).collect::<Vec<_>>();
    if let Some(k) = layout.body {
        columns.push(("body".into(), text_column(k, texts(|r| r.body.clone()))));
    }
    if let Some(k) = layout.group {
        columns.push((
            "message_group_id".into(),
            text_column(k, texts(|r| r.group.clone())),
        ));
    }
    if let Some(k) = layout.dedup {
        columns.push((
            "message_deduplication_id".into(),
            text_column(k, texts(|r| r.dedup.clone())),
        ));
    }
    if let Some(k) = layout.delay {
        columns.push((
            "delay_seconds".into(),
            delay_column(k, rows.iter().map(|r| r.delay).collect()),
        ));
    }
    if let Some(k) = layout.attrs {
        let values: Vec<_> = rows.iter().map(|r| r.attrs.clone()).collect();
        columns.push(("message_attributes".into(), attrs_column(k, &values)));
    }
    if let Some(name) = &layout.extra {
        columns.push((
            name.clone(),
            text_column(Text::Utf8, texts(|r| r.body.clone())),
        ));
    }
    let fields: Vec<Field> = columns
        .iter()
        .map(|(n, a)| Field::new(n, a.data_type().clone(), true))
        .collect();
    let arrays = columns.into_iter().map(|(_, a)| a).collect();
    RecordBatch::try_new_with_options(
        Arc::new(Schema::new(fields)),
        arrays,
        &arrow_array::RecordBatchOptions::new().with_row_count(Some(rows.len())),
    )
    .unwrap()
}

// ---- SQS's rules, written out independently of rows.rs ----

fn sqs_text(s: &str) -> bool {
    s.chars().all(|c| {
        let c = c as u32;
        c == 0x9
            || c == 0xA
            || c == 0xD
            || (0x20..=0xD7FF).contains(&c)
            || (0xE000..=0xFFFD).contains(&c)
            || (0x10000..=0x10FFFF).contains(&c)
    })
}

fn sqs_attr_name(n: &str) -> bool {
    let lower = n.to_ascii_lowercase();
    (1..=256).contains(&n.len())
        && n.chars()
            .all(|c| c.is_ascii_alphanumeric() || "_-.".contains(c))
        && !n.starts_with('.')
        && !n.ends_with('.')
        && !n.contains("..")
        && !lower.starts_with("aws.")
        && !lower.starts_with("amazon.")
}

fn sqs_id(s: &str) -> bool {
    (1..=128).contains(&s.len()) && s.chars().all(|c| c.is_ascii_graphic())
}

/// Would SQS take this row (as DoPut reads it: null attribute values are
/// absent, null delay is none)?
fn sqs_accepts(layout: &Layout, r: &Row, fifo: bool) -> bool {
    let Some(body) = &r.body else { return false };
    let attrs = effective_attrs(layout, r);
    let group = layout.group.and(r.group.as_ref());
    let dedup = layout.dedup.and(r.dedup.as_ref());
    let delay = layout
        .delay
        .and_then(|k| r.delay.map(|d| encoded_delay(k, d)));
    let size: usize = body.len()
        + attrs
            .iter()
            .map(|(k, v)| k.len() + 6 + v.len())
            .sum::<usize>();
    let mut names: Vec<&String> = attrs.iter().map(|(k, _)| k).collect();
    names.sort();
    names.dedup();
    !body.is_empty()
        && sqs_text(body)
        && attrs.len() <= 10
        && names.len() == attrs.len()
        && attrs
            .iter()
            .all(|(k, v)| sqs_attr_name(k) && !v.is_empty() && sqs_text(v))
        && group.is_none_or(|g| sqs_id(g))
        && dedup.is_none_or(|d| sqs_id(d))
        && size <= MAX_MESSAGE_BYTES
        && match delay {
            Some(_) if fifo => false,
            Some(d) => (0..=900).contains(&d),
            None => true,
        }
        && (!fifo || group.is_some())
}

fn schema_ok(layout: &Layout) -> bool {
    let text = |t: Option<Text>| !matches!(t, Some(Text::Binary | Text::Int32));
    layout.body.is_some()
        && text(layout.body)
        && text(layout.group)
        && text(layout.dedup)
        && !matches!(layout.delay, Some(Int::F64 | Int::Utf8))
        && !matches!(layout.attrs, Some(Attrs::Utf8))
        && layout.extra.is_none()
}

fn assert_carried(layout: &Layout, r: &Row, m: &OutgoingMessage) {
    assert_eq!(Some(&m.body), r.body.as_ref());
    assert_eq!(
        m.message_group_id.as_ref(),
        layout.group.and(r.group.as_ref())
    );
    assert_eq!(
        m.message_deduplication_id.as_ref(),
        layout.dedup.and(r.dedup.as_ref())
    );
    assert_eq!(
        m.delay_seconds.map(i128::from),
        layout
            .delay
            .and_then(|k| r.delay.map(|d| encoded_delay(k, d)))
    );
    assert_eq!(m.attributes, effective_attrs(layout, r));
}

/// The attributes a row carries as DoPut reads them: null values are
/// absent; integer values become their decimal text.
fn effective_attrs(layout: &Layout, r: &Row) -> Vec<(String, String)> {
    match (layout.attrs, &r.attrs) {
        (Some(kind), Some(a)) => a
            .iter()
            .filter_map(|(k, v)| {
                let v = v.as_ref()?;
                let v = match kind {
                    Attrs::MapIntValues => v.len().to_string(),
                    _ => v.clone(),
                };
                Some((k.clone(), v))
            })
            .collect(),
        _ => Vec::new(),
    }
}

proptest! {
    #![proptest_config(cases(256))]

    #[test]
    fn doput_validation_refuses_by_name_and_accepts_only_what_sqs_takes(
        layout in layout(),
        rows in proptest::collection::vec(row(), 0..6),
        first_row in prop_oneof![Just(0u64), any::<u32>().prop_map(u64::from)],
        fifo in any::<bool>(),
    ) {
        let b = batch(&layout, &rows);
        let schema_verdict = rows::check_schema(&b.schema());
        let expect_ok = schema_ok(&layout);
        match schema_verdict {
            Err(e) => {
                prop_assert!(!expect_ok, "refused a usable schema {layout:?}: {e}");
                let text = e.to_string();
                prop_assert!(matches!(e, WriteError::Schema(_)));
                prop_assert!(text.contains('`'), "names no column: {text}");
                return Ok(());
            }
            Ok(()) => prop_assert!(expect_ok, "accepted {layout:?}"),
        }
        let (messages, bad) = match rows::messages(&b, first_row, rows::RowRules::sqs(fifo)) {
            Ok(x) => x,
            // A column of an accepted type that does not convert: must name it.
            Err(e) => {
                let text = e.to_string();
                prop_assert!(text.contains('`'), "names no column: {text}");
                return Ok(());
            }
        };
        prop_assert!(messages.len() <= rows.len());
        for (r, m) in rows.iter().zip(&messages) {
            prop_assert!(sqs_accepts(&layout, r, fifo), "accepted a row SQS refuses: {r:?}");
            assert_carried(&layout, r, m);
        }
        match bad {
            None => prop_assert_eq!(messages.len(), rows.len()),
            Some(WriteError::Row { row, reason }) => {
                let i = messages.len();
                prop_assert_eq!(row, first_row + i as u64);
                prop_assert!(!reason.is_empty() && reason.len() < 1024, "{reason:.200}");
                prop_assert!(
                    !sqs_accepts(&layout, &rows[i], fifo),
                    "refused row {i} that SQS takes ({reason}): {:?}", rows[i]
                );
            }
            Some(other) => prop_assert!(false, "not a row error: {other}"),
        }
    }
}

#[test]
fn an_out_of_range_delay_is_refused_not_dropped() {
    for (array, shown) in [
        (
            Arc::new(Int64Array::from(vec![1i64 << 40])) as ArrayRef,
            "1099511627776",
        ),
        (
            Arc::new(UInt64Array::from(vec![u64::MAX])),
            "18446744073709551615",
        ),
        (Arc::new(Int64Array::from(vec![-1i64])), "-1"),
    ] {
        let b = RecordBatch::try_from_iter([
            ("body", Arc::new(StringArray::from(vec!["x"])) as ArrayRef),
            ("delay_seconds", array),
        ])
        .unwrap();
        let (msgs, err) = rows::messages(&b, 7, rows::RowRules::sqs(false)).unwrap();
        assert!(msgs.is_empty());
        let err = err.expect("refused").to_string();
        assert!(
            err.starts_with("row 7: delay_seconds is ") && err.contains(shown),
            "{err}"
        );
    }
}

/// A change to one DoPut IPC message: a byte of its header or body set, or
/// the 8-byte length prefix at some offset of its body overwritten (where a
/// compressed buffer says how long it decompresses).
#[derive(Debug, Clone)]
enum Mutation {
    Header(usize, u8),
    Body(usize, u8),
    Claim(usize, i64),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    let claim = prop_oneof![
        Just(-1i64),
        any::<i64>(),
        (30u32..63).prop_map(|bits| 1i64 << bits),
        0i64..4096,
    ];
    prop_oneof![
        (any::<usize>(), any::<u8>()).prop_map(|(at, b)| Mutation::Header(at, b)),
        (any::<usize>(), any::<u8>()).prop_map(|(at, b)| Mutation::Body(at, b)),
        (any::<usize>(), claim).prop_map(|(at, c)| Mutation::Claim(at, c)),
    ]
}

fn mutate(data: &mut arrow_flight::FlightData, m: &Mutation) {
    let patch = |bytes: &mut bytes::Bytes, at: usize, with: &[u8]| {
        if bytes.len() >= with.len() {
            let at = at % (bytes.len() - with.len() + 1);
            let mut v = bytes.to_vec();
            v[at..at + with.len()].copy_from_slice(with);
            *bytes = v.into();
        }
    };
    match *m {
        Mutation::Header(at, b) => patch(&mut data.data_header, at, &[b]),
        Mutation::Body(at, b) => patch(&mut data.data_body, at, &[b]),
        Mutation::Claim(at, c) => patch(&mut data.data_body, at & !7, &c.to_le_bytes()),
    }
}

/// The DoPut messages (schema first) arrow-flight's encoder makes of `b`.
fn ipc_messages(
    b: &RecordBatch,
    codec: Option<arrow_ipc::CompressionType>,
) -> Vec<arrow_flight::FlightData> {
    use futures::TryStreamExt;
    let options = arrow_ipc::writer::IpcWriteOptions::default()
        .try_with_compression(codec)
        .unwrap();
    let encoded = arrow_flight::encode::FlightDataEncoderBuilder::new()
        .with_options(options)
        .build(futures::stream::iter([Ok(b.clone())]));
    futures::executor::block_on(encoded.try_collect()).unwrap()
}

proptest! {
    #![proptest_config(cases(256))]

    /// Mangled IPC bodies, compressed or not, never end the process: the
    /// header check refuses them, or arrow decodes them or says they do
    /// not decode (a decoder panic is caught as DoPut catches it). With the
    /// check left out, a claimed length of 2^40 aborts this test binary.
    #[test]
    fn mangled_doput_ipc_messages_are_refused_or_decoded_never_fatal(
        layout in layout(),
        rows in proptest::collection::vec(row(), 1..6),
        codec in prop_oneof![
            Just(None),
            Just(Some(arrow_ipc::CompressionType::ZSTD)),
            Just(Some(arrow_ipc::CompressionType::LZ4_FRAME)),
        ],
        mutations in proptest::collection::vec(mutation(), 1..4),
    ) {
        use futures::StreamExt;
        use sqs_flight_server::testing::{CatchPanic, IpcBounds};
        let mut messages = ipc_messages(&batch(&layout, &rows), codec);
        let last = messages.len() - 1;
        for m in &mutations {
            mutate(&mut messages[last], m);
        }
        let mut bounds = IpcBounds::new(64 << 20, 10_000_000);
        if messages.iter().try_for_each(|m| bounds.check(m)).is_err() {
            return Ok(());
        }
        let sent = messages.len();
        let input = futures::stream::iter(messages.into_iter().map(Ok));
        let decoded = CatchPanic::new(
            arrow_flight::decode::FlightRecordBatchStream::new_from_flight_data(input),
        );
        let results: Vec<_> = futures::executor::block_on(decoded.collect());
        let shown: Vec<String> = results.iter().map(|r| match r {
            Ok(b) => format!("{} rows", b.num_rows()),
            Err(e) => format!("{e:.200}"),
        }).collect();
        prop_assert!(results.len() < sent, "one answer per batch at most: {shown:?}");
    }
}
