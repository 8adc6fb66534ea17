//! Property tests of everything in this crate that reads client bytes: the
//! JSON commands, tickets, and the payload decoder.
//!
//! Each property runs a bounded number of cases inside the normal test run;
//! set `PROPTEST_CASES` to run longer, e.g.
//! `PROPTEST_CASES=20000 cargo test -p sqs-flight-schemas --test fuzz`, and
//! `PROPTEST_RNG_SEED=N` to replay a run.

use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::{Array, RecordBatch};
use proptest::prelude::*;
use serde_json::{Map, Value, json};
use sqs_flight_schemas::command::{MAX_BATCH, MAX_NAME_LEN};
use sqs_flight_schemas::payload::{PAYLOAD, PAYLOAD_ERROR, PayloadDecoder, PayloadSpec, Unwrap};
use sqs_flight_schemas::{
    CommitCommand, FieldError, PlanCommand, ReleaseCommand, SqsMessage, StatusCommand, TicketId,
    message::messages_to_batch, table_schema,
};

#[path = "../../tests/src/proptest_cases.rs"]
mod proptest_cases;
use proptest_cases::cases;

/// A plan command's fields: its names, then every plan parameter.
fn plan_fields() -> Vec<&'static str> {
    let mut fields = vec!["table", "consumer", "batch"];
    fields.extend(sqs_flight_schemas::plan::PLAN_PARAMS.iter().map(|p| p.name));
    fields
}
const COMMIT_FIELDS: &[&str] = &[
    "table",
    "consumer",
    "batch",
    "reject",
    "reject_delay_seconds",
    "reject_payload_errors",
];
const RELEASE_FIELDS: &[&str] = &["table", "consumer", "read_ahead_only"];
const STATUS_FIELDS: &[&str] = &["table"];
const TICKET_FIELDS: &[&str] = &["v", "table", "consumer", "batch", "partition", "plan"];

/// Every error names the field it is about (or says the document itself is
/// not JSON / not an object), and stays short whatever the input.
fn assert_names_a_field(e: &FieldError, known: &[&str], input: &[u8]) {
    let text = e.to_string();
    assert!(
        text.len() < 1024,
        "error of {} bytes: {text:.200}",
        text.len()
    );
    let field = match e {
        FieldError::Malformed { .. } | FieldError::NotAnObject { .. } => return,
        FieldError::Missing { field, .. }
        | FieldError::Type { field, .. }
        | FieldError::Range { field, .. } => {
            assert!(known.contains(field), "{text}: not a known field");
            field.to_string()
        }
        FieldError::Unknown { field, .. } | FieldError::Duplicate { field, .. } => field.clone(),
    };
    assert!(
        text.contains(&format!("`{field}`")),
        "{text} does not name `{field}`; input {:?}",
        String::from_utf8_lossy(input)
    );
}

fn valid_name(name: &str) -> bool {
    !name.is_empty() && name.len() <= MAX_NAME_LEN && !name.chars().any(char::is_control)
}

/// What every decoded command promises, checked against its input.
fn assert_object_agrees(input: &[u8], known: &[&str], pairs: &[(&str, Value)]) {
    let Ok(Value::Object(obj)) = serde_json::from_slice::<Value>(input) else {
        panic!("accepted input is not a JSON object")
    };
    for key in obj.keys() {
        assert!(
            known.contains(&key.as_str()),
            "unknown key {key:?} accepted"
        );
    }
    for (field, decoded) in pairs {
        match obj.get(*field) {
            None | Some(Value::Null) => {}
            Some(given) => assert_eq!(given, decoded, "field `{field}`"),
        }
    }
}

fn check_plan(input: &[u8]) {
    match PlanCommand::parse(input) {
        Ok(cmd) => {
            assert!(valid_name(&cmd.table) && valid_name(&cmd.consumer));
            assert!(cmd.batch.is_none_or(|b| b <= MAX_BATCH));
            assert_eq!(PlanCommand::parse(&cmd.to_json()).unwrap(), cmd);
            let decoded: Value = serde_json::from_slice(&cmd.to_json()).unwrap();
            let fields = plan_fields();
            let pairs: Vec<(&str, Value)> = fields
                .iter()
                .map(|&f| (f, decoded.get(f).cloned().unwrap_or(Value::Null)))
                .collect();
            assert_object_agrees(input, &fields, &pairs);
        }
        Err(e) => assert_names_a_field(&e, &plan_fields(), input),
    }
}

fn check_commit(input: &[u8]) {
    match CommitCommand::parse(input) {
        Ok(cmd) => {
            assert!(valid_name(&cmd.table) && valid_name(&cmd.consumer));
            assert!(cmd.batch <= MAX_BATCH);
            assert_eq!(CommitCommand::parse(&cmd.to_json()).unwrap(), cmd);
            assert_object_agrees(
                input,
                COMMIT_FIELDS,
                &[
                    ("table", json!(cmd.table)),
                    ("consumer", json!(cmd.consumer)),
                    ("batch", json!(cmd.batch)),
                    ("reject_delay_seconds", json!(cmd.reject_delay_seconds)),
                    ("reject_payload_errors", json!(cmd.reject_payload_errors)),
                ],
            );
        }
        Err(e) => assert_names_a_field(&e, COMMIT_FIELDS, input),
    }
}

fn check_release(input: &[u8]) {
    match ReleaseCommand::parse(input) {
        Ok(cmd) => {
            assert!(valid_name(&cmd.table) && valid_name(&cmd.consumer));
            assert_eq!(ReleaseCommand::parse(&cmd.to_json()).unwrap(), cmd);
            assert_object_agrees(
                input,
                RELEASE_FIELDS,
                &[
                    ("table", json!(cmd.table)),
                    ("consumer", json!(cmd.consumer)),
                    ("read_ahead_only", json!(cmd.read_ahead_only)),
                ],
            );
        }
        Err(e) => assert_names_a_field(&e, RELEASE_FIELDS, input),
    }
}

fn check_status(input: &[u8]) {
    match StatusCommand::parse(input) {
        Ok(cmd) => {
            assert!(cmd.table.as_deref().is_none_or(valid_name));
            assert_eq!(StatusCommand::parse(&cmd.to_json()).unwrap(), cmd);
            if !input.iter().all(u8::is_ascii_whitespace) {
                assert_object_agrees(input, STATUS_FIELDS, &[("table", json!(cmd.table))]);
            }
        }
        Err(e) => assert_names_a_field(&e, STATUS_FIELDS, input),
    }
}

fn check_ticket(input: &[u8]) {
    match TicketId::decode(input) {
        Ok(id) => {
            assert!(valid_name(&id.table) && valid_name(&id.consumer));
            assert!(id.batch <= MAX_BATCH);
            assert_eq!(TicketId::decode(&id.encode()).unwrap(), id);
            assert_object_agrees(
                input,
                TICKET_FIELDS,
                &[
                    ("v", json!(1)),
                    ("table", json!(id.table)),
                    ("consumer", json!(id.consumer)),
                    ("batch", json!(id.batch)),
                    ("partition", json!(id.partition)),
                    ("plan", json!(id.plan)),
                ],
            );
        }
        Err(e) => assert_names_a_field(&e, TICKET_FIELDS, input),
    }
}

fn check_all(input: &[u8]) {
    check_plan(input);
    check_commit(input);
    check_release(input);
    check_status(input);
    check_ticket(input);
}

/// Names: mostly valid, sometimes empty, too long, or with control characters.
fn name() -> impl Strategy<Value = String> {
    prop_oneof![
        6 => "[A-Za-z0-9._-]{1,40}",
        2 => "\\PC{1,20}",
        1 => Just(String::new()),
        1 => "[a-z]{250,260}",
        1 => "[a-z]{0,5}[\\x00-\\x1f\\x7f][a-z]{0,5}",
        1 => ".{0,20}",
    ]
}

/// Numbers of every kind a client may write.
fn number() -> impl Strategy<Value = Value> {
    prop_oneof![
        4 => (0u64..1000).prop_map(|n| json!(n)),
        1 => any::<u64>().prop_map(|n| json!(n)),
        1 => Just(json!(MAX_BATCH)),
        1 => Just(json!(MAX_BATCH + 1)),
        1 => Just(json!(u32::MAX as u64 + 1)),
        1 => any::<i64>().prop_map(|n| json!(n)),
        1 => any::<f64>().prop_map(|f| serde_json::Number::from_f64(f).map_or(Value::Null, Value::Number)),
    ]
}

/// Arbitrary JSON values, keys biased to the fields the decoders know.
fn any_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        number(),
        name().prop_map(Value::String),
    ];
    leaf.prop_recursive(6, 64, 8, |inner| {
        let key = prop_oneof![
            4 => proptest::sample::select(TICKET_FIELDS.iter().copied().chain(plan_fields()).collect::<Vec<_>>())
                .prop_map(str::to_string),
            1 => ".{0,12}",
        ];
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            proptest::collection::btree_map(key, inner, 0..8)
                .prop_map(|m| Value::Object(m.into_iter().collect::<Map<_, _>>())),
        ]
    })
}

fn plan_command() -> impl Strategy<Value = PlanCommand> {
    let opt = || proptest::option::of(0u64..=MAX_BATCH);
    (
        name(),
        name(),
        (opt(), opt(), opt()),
        (opt(), opt(), opt(), opt(), opt(), opt(), opt()),
    )
        .prop_map(
            |(table, consumer, (batch, partitions, max_messages), (w, b, d, r, a, p, k))| {
                PlanCommand {
                    table,
                    consumer,
                    batch,
                    partitions,
                    max_messages,
                    max_wait_ms: w,
                    max_bytes: b,
                    max_duration_ms: d,
                    receivers: r,
                    read_ahead: a,
                    receive_at_plan: p,
                    backlog_max_messages: k,
                }
            },
        )
}

fn ticket() -> impl Strategy<Value = TicketId> {
    (name(), name(), 0..=MAX_BATCH, any::<u32>(), any::<u64>()).prop_map(
        |(table, consumer, batch, partition, plan)| TicketId {
            table,
            consumer,
            batch,
            partition,
            plan,
        },
    )
}

/// One way of spoiling a valid document.
#[derive(Debug, Clone)]
enum Mutation {
    Drop(usize),
    Retype(usize, Value),
    Add(String, Value),
    Duplicate(usize, Value),
    Nest(usize, usize),
    Text(usize, &'static str),
    Truncate(usize),
    Byte(usize, u8),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    let raw = proptest::sample::select(vec![
        "1e400",
        "-1",
        "-0",
        "1.0",
        "18446744073709551616",
        "9223372036854775808",
        "4294967296",
        "\"\\ud800\"",
        "\"\\u0000\"",
        "\"\"",
        "NaN",
        "[]",
        "{}",
    ]);
    prop_oneof![
        any::<usize>().prop_map(Mutation::Drop),
        (any::<usize>(), any_json()).prop_map(|(i, v)| Mutation::Retype(i, v)),
        (".{0,10}", any_json()).prop_map(|(k, v)| Mutation::Add(k, v)),
        (any::<usize>(), any_json()).prop_map(|(i, v)| Mutation::Duplicate(i, v)),
        (any::<usize>(), 1usize..300).prop_map(|(i, d)| Mutation::Nest(i, d)),
        (any::<usize>(), raw).prop_map(|(i, r)| Mutation::Text(i, r)),
        any::<usize>().prop_map(Mutation::Truncate),
        (
            any::<usize>(),
            prop_oneof![Just(0xffu8), Just(0xc0), Just(0x80), Just(0)]
        )
            .prop_map(|(i, b)| Mutation::Byte(i, b)),
    ]
}

/// Applies `m` to the JSON text of `valid` (an object).
fn mutate(valid: &Value, m: &Mutation) -> Vec<u8> {
    let obj = valid.as_object().expect("an object");
    let keys: Vec<String> = obj.keys().cloned().collect();
    let key = |i: usize| keys[i % keys.len()].clone();
    let mut obj = obj.clone();
    let text_with = |k: &str, raw: &str, obj: &Map<String, Value>| {
        let mut parts: Vec<String> = obj
            .iter()
            .filter(|(kk, _)| kk.as_str() != k)
            .map(|(kk, v)| format!("{}:{v}", Value::String(kk.clone())))
            .collect();
        parts.push(format!("{}:{raw}", Value::String(k.to_string())));
        format!("{{{}}}", parts.join(",")).into_bytes()
    };
    match m {
        Mutation::Drop(i) => {
            obj.remove(&key(*i));
        }
        Mutation::Retype(i, v) => {
            obj.insert(key(*i), v.clone());
        }
        Mutation::Add(k, v) => {
            obj.insert(k.clone(), v.clone());
        }
        Mutation::Duplicate(i, v) => {
            let k = key(*i);
            let body = Value::Object(obj).to_string();
            let dup = format!("{{{}:{v},", Value::String(k));
            return body.replacen('{', &dup, 1).into_bytes();
        }
        Mutation::Nest(i, depth) => {
            let raw = format!("{}1{}", "[".repeat(*depth), "]".repeat(*depth));
            return text_with(&key(*i), &raw, &obj);
        }
        Mutation::Text(i, raw) => return text_with(&key(*i), raw, &obj),
        Mutation::Truncate(at) => {
            let bytes = Value::Object(obj).to_string().into_bytes();
            return bytes[..at % (bytes.len() + 1)].to_vec();
        }
        Mutation::Byte(at, b) => {
            let mut bytes = Value::Object(obj).to_string().into_bytes();
            let n = bytes.len();
            bytes[at % n] = *b;
            return bytes;
        }
    }
    Value::Object(obj).to_string().into_bytes()
}

fn plan_json(cmd: &PlanCommand) -> Value {
    serde_json::from_slice(&cmd.to_json()).unwrap()
}

fn ticket_json(id: &TicketId) -> Value {
    serde_json::from_slice(&id.encode()).unwrap()
}

proptest! {
    #![proptest_config(cases(512))]

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
        check_all(&bytes);
    }

    #[test]
    fn arbitrary_json_never_panics(value in any_json()) {
        check_all(value.to_string().as_bytes());
    }

    #[test]
    fn valid_commands_round_trip(cmd in plan_command()) {
        let json = cmd.to_json();
        let ok = valid_name(&cmd.table) && valid_name(&cmd.consumer);
        match PlanCommand::parse(&json) {
            Ok(back) => {
                prop_assert!(ok, "accepted bad names: {cmd:?}");
                prop_assert_eq!(back, cmd.clone());
            }
            Err(e) => {
                prop_assert!(!ok, "refused a valid command {cmd:?}: {e}");
                assert_names_a_field(&e, &plan_fields(), &json);
            }
        }
        let commit = CommitCommand::new(cmd.table.clone(), cmd.consumer.clone(), cmd.batch.unwrap_or(0));
        match CommitCommand::parse(&commit.to_json()) {
            Ok(back) => prop_assert!(ok && back == commit),
            Err(e) => prop_assert!(!ok, "{e}"),
        }
        let release = ReleaseCommand::new(cmd.table.clone(), cmd.consumer.clone());
        match ReleaseCommand::parse(&release.to_json()) {
            Ok(back) => prop_assert!(ok && back == release),
            Err(e) => prop_assert!(!ok, "{e}"),
        }
        let status = StatusCommand { table: Some(cmd.table.clone()), max_age_ms: None };
        match StatusCommand::parse(&status.to_json()) {
            Ok(back) => prop_assert!(valid_name(&cmd.table) && back == status),
            Err(e) => prop_assert!(!valid_name(&cmd.table), "{e}"),
        }
    }

    #[test]
    fn valid_tickets_round_trip(id in ticket()) {
        let ok = valid_name(&id.table) && valid_name(&id.consumer);
        match TicketId::decode(&id.encode()) {
            Ok(back) => prop_assert!(ok && back == id),
            Err(e) => {
                prop_assert!(!ok, "refused a valid ticket {id:?}: {e}");
                assert_names_a_field(&e, TICKET_FIELDS, &id.encode());
            }
        }
    }

    #[test]
    fn mutated_commands_never_panic(
        cmd in plan_command(),
        ms in proptest::collection::vec(mutation(), 1..4),
    ) {
        let mut doc = plan_json(&cmd);
        for m in &ms {
            let bytes = mutate(&doc, m);
            check_all(&bytes);
            // Go on mutating while the text is still an object.
            match serde_json::from_slice::<Value>(&bytes) {
                Ok(v @ Value::Object(_)) if !v.as_object().unwrap().is_empty() => doc = v,
                _ => break,
            }
        }
    }

    #[test]
    fn mutated_tickets_never_panic(
        id in ticket(),
        ms in proptest::collection::vec(mutation(), 1..4),
    ) {
        let mut doc = ticket_json(&id);
        for m in &ms {
            let bytes = mutate(&doc, m);
            check_all(&bytes);
            match serde_json::from_slice::<Value>(&bytes) {
                Ok(v @ Value::Object(_)) if !v.as_object().unwrap().is_empty() => doc = v,
                _ => break,
            }
        }
    }
}

#[test]
fn deep_nesting_and_huge_numbers_are_errors_not_crashes() {
    for depth in [10, 127, 128, 129, 1000, 100_000] {
        let doc = format!(
            r#"{{"table":{}"t"{}}}"#,
            "[".repeat(depth),
            "]".repeat(depth)
        );
        check_all(doc.as_bytes());
        assert!(PlanCommand::parse(doc.as_bytes()).is_err());
    }
    for n in [
        "1e400",
        "18446744073709551616",
        "-9223372036854775809",
        "1.5",
        "-0",
    ] {
        let doc = format!(r#"{{"table":"t","batch":{n}}}"#);
        let e = PlanCommand::parse(doc.as_bytes()).unwrap_err();
        assert_names_a_field(&e, &plan_fields(), doc.as_bytes());
    }
    // A huge string value is quoted back only in part.
    let doc = format!(r#"{{"table":"t","batch":"{}"}}"#, "9".repeat(1 << 20));
    let e = PlanCommand::parse(doc.as_bytes()).unwrap_err().to_string();
    assert!(e.contains("`batch`") && e.len() < 300, "{:.300}", e);
}

// ---- the payload decoder ----------------------------------------------

fn decoder(unwrap: Unwrap) -> PayloadDecoder {
    let spec: PayloadSpec = serde_json::from_value(json!({
        "unwrap": unwrap,
        "fields": [
            {"name": "id", "type": "int64"},
            {"name": "name", "type": "utf8"},
            {"name": "ok", "type": "bool"},
            {"name": "score", "type": "float64"},
            {"name": "user", "type": "struct", "fields": [{"name": "n", "type": "int32"}]},
            {"name": "tags", "type": "list", "item": {"type": "utf8"}},
            {"name": "at", "type": "timestamp", "unit": "ms", "timezone": "UTC"}
        ]
    }))
    .unwrap();
    PayloadDecoder::new(&spec, &table_schema()).unwrap()
}

fn batch_of(bodies: &[String]) -> RecordBatch {
    let msgs: Vec<_> = bodies
        .iter()
        .enumerate()
        .map(|(i, b)| SqsMessage {
            message_id: format!("m{i}"),
            body: b.clone(),
            ..Default::default()
        })
        .collect();
    messages_to_batch(&msgs, 1, 0).unwrap()
}

/// Bodies: arbitrary text, arbitrary JSON, payload-shaped objects, SNS
/// envelopes of them, and objects written back to back.
fn shaped() -> impl Strategy<Value = String> {
    (
        proptest::option::of(any::<i64>()),
        proptest::option::of(".{0,8}"),
        proptest::option::of(any::<bool>()),
        proptest::option::of(any_json()),
    )
        .prop_map(|(id, name, ok, extra)| {
            json!({"id": id, "name": name, "ok": ok, "extra": extra, "tags": ["a"]}).to_string()
        })
}

fn body() -> impl Strategy<Value = String> {
    prop_oneof![
        2 => ".{0,40}",
        2 => any_json().prop_map(|v| v.to_string()),
        4 => shaped(),
        2 => shaped().prop_map(|m| json!({"Type": "Notification", "Message": m}).to_string()),
        1 => (shaped(), shaped()).prop_map(|(a, b)| format!("{a}{b}")),
        1 => Just("{\"id\": 1} {\"id\": 2}".to_string()),
    ]
}

/// The payload and error of one body decoded alone.
fn alone(d: &PayloadDecoder, body: &str) -> (Option<Arc<dyn Array>>, Option<String>) {
    let out = d.extend(batch_of(&[body.to_string()])).unwrap();
    let payload = out.column_by_name(PAYLOAD).unwrap();
    let errors = out
        .column_by_name(PAYLOAD_ERROR)
        .unwrap()
        .as_string::<i32>();
    (
        payload.is_valid(0).then(|| payload.slice(0, 1)),
        errors.is_valid(0).then(|| errors.value(0).to_string()),
    )
}

fn check_payload_rows(bodies: &[String], sns: bool, compare_alone: bool) {
    let d = decoder(if sns { Unwrap::Sns } else { Unwrap::None });
    let out = d.extend(batch_of(bodies)).unwrap();
    assert_eq!(out.num_rows(), bodies.len());
    assert_eq!(out.schema(), d.table_schema());
    let body_col = out.column_by_name("body").unwrap().as_string::<i32>();
    let payload = out.column_by_name(PAYLOAD).unwrap();
    let errors = out
        .column_by_name(PAYLOAD_ERROR)
        .unwrap()
        .as_string::<i32>();
    for (i, b) in bodies.iter().enumerate() {
        assert_eq!(body_col.value(i), b.as_str());
        // Exactly one of payload and error per row.
        assert_ne!(payload.is_valid(i), errors.is_valid(i), "row {i}: {b:?}");
        if compare_alone {
            // The row decodes as it does on its own: nothing shifts between rows.
            let (p, e) = alone(&d, b);
            match p {
                Some(p) => assert_eq!(payload.slice(i, 1).to_data(), p.to_data(), "row {i}: {b:?}"),
                None => assert!(payload.is_null(i) && e.is_some(), "row {i}: {b:?}"),
            }
        }
    }
}

proptest! {
    #![proptest_config(cases(256))]

    /// No panic, no row dropped, body kept, payload xor error.
    #[test]
    fn payload_decoding_keeps_every_row(
        bodies in proptest::collection::vec(body(), 0..12),
        sns in any::<bool>(),
    ) {
        check_payload_rows(&bodies, sns, false);
    }

    /// Each row's payload is its own body's, even when a body holds two
    /// JSON objects back to back (which once filled the next row's slot in
    /// the batch decode, shifting every later row's payload).
    #[test]
    fn payload_rows_are_decoded_in_place(
        bodies in proptest::collection::vec(body(), 0..12),
        sns in any::<bool>(),
    ) {
        check_payload_rows(&bodies, sns, true);
    }

    /// The same property without bodies of several JSON values.
    #[test]
    fn payload_rows_of_single_values_are_decoded_in_place(
        bodies in proptest::collection::vec(
            body().prop_filter("one JSON value at most", |b| {
                serde_json::from_str::<Value>(b).is_ok() || !b.trim_start().starts_with('{')
            }),
            0..12,
        ),
        sns in any::<bool>(),
    ) {
        check_payload_rows(&bodies, sns, true);
    }
}

/// The smallest case of that shift, as a plain regression test.
#[test]
fn two_objects_in_one_body_do_not_shift_the_next_row() {
    let bodies = [
        r#"{"id": 1}{"id": 2}"#.to_string(),
        r#"{"id": 3}"#.to_string(),
    ];
    check_payload_rows(&bodies, false, true);
}
