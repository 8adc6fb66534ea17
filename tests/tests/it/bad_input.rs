//! Bad input gets the right Flight status, names the problem, and changes
//! nothing in the queue.

use arrow_flight::{FlightDescriptor, Ticket};
use serde_json::json;

use sqs_flight_tests::prelude::*;

#[tokio::test]
async fn bad_plan_commands_are_refused_with_the_field_named() {
    let mut f = Fixture::standard(3).await;
    use tonic::Code::*;
    let cases: Vec<(&str, tonic::Code, &str)> = vec![
        ("{", InvalidArgument, "not valid JSON"),
        ("[]", InvalidArgument, "JSON object"),
        ("{}", InvalidArgument, "`table`"),
        (r#"{"table":"t","bogus":1}"#, InvalidArgument, "`bogus`"),
        (r#"{"table":"t","batch":"1"}"#, InvalidArgument, "`batch`"),
        (
            r#"{"table":"t","partitions":0}"#,
            InvalidArgument,
            "`partitions`",
        ),
        (
            r#"{"table":"t","partitions":65}"#,
            InvalidArgument,
            "limit 64",
        ),
        (
            r#"{"table":"t","max_messages":100001}"#,
            InvalidArgument,
            "limit 100000",
        ),
        (
            r#"{"table":"t","max_wait_ms":20001}"#,
            InvalidArgument,
            "limit 20000",
        ),
        (
            r#"{"table":"t","max_bytes":268435457}"#,
            InvalidArgument,
            "`max_bytes`",
        ),
        (
            r#"{"table":"t","max_duration_ms":300001}"#,
            InvalidArgument,
            "`max_duration_ms`",
        ),
        (
            r#"{"table":"t","consumer":7}"#,
            InvalidArgument,
            "`consumer`",
        ),
        (r#"{"table":"nope"}"#, NotFound, "nope"),
    ];
    for (cmd, code, needle) in cases {
        let d = FlightDescriptor::new_cmd(cmd.to_string());
        let err = status(bounded(f.flight.get_flight_info(d)).await.unwrap_err());
        assert_eq!(err.code(), code, "{cmd}: {err}");
        assert!(err.message().contains(needle), "{cmd}: {err}");
    }
    let d = FlightDescriptor::new_path(vec!["t".into(), "x".into()]);
    let err = status(bounded(f.flight.get_flight_info(d)).await.unwrap_err());
    assert_eq!(err.code(), InvalidArgument, "{err}");
    assert_eq!(f.counts().await, (3, 0), "the queue is untouched");
}

#[tokio::test]
async fn bad_tickets_are_refused_and_receive_nothing() {
    let mut f = Fixture::standard(3).await;
    use tonic::Code::*;
    let forged = |plan: u64, partition: u32| {
        json!({"v":1,"table":"t","consumer":"default","batch":1,"partition":partition,"plan":plan})
            .to_string()
    };
    let info = f
        .plan(json!({"table": "t", "partitions": 1}))
        .await
        .unwrap();
    let real: serde_json::Value =
        serde_json::from_slice(&tickets(&info)[0].ticket).expect("tickets are JSON inside");
    let plan = real["plan"].as_u64().unwrap();
    let cases: Vec<(Vec<u8>, tonic::Code)> = vec![
        (b"".to_vec(), InvalidArgument),
        (b"\x00\xff garbage".to_vec(), InvalidArgument),
        (br#"{"v":9}"#.to_vec(), InvalidArgument),
        (forged(plan + 1, 0).into_bytes(), FailedPrecondition),
        (forged(plan, 5).into_bytes(), InvalidArgument),
        (
            json!({"v":1,"table":"zz","consumer":"c","batch":1,"partition":0,"plan":1})
                .to_string()
                .into_bytes(),
            NotFound,
        ),
    ];
    for (bytes, code) in cases {
        let err = f.read(&Ticket::new(bytes.clone())).await.unwrap_err();
        assert_eq!(
            err.code(),
            code,
            "{:?}: {err}",
            String::from_utf8_lossy(&bytes)
        );
    }
    assert_eq!(f.counts().await, (3, 0), "the queue is untouched");
}

#[tokio::test]
async fn bad_actions_are_refused_and_change_nothing() {
    let mut f = Fixture::standard(2).await;
    let info = f
        .plan(json!({"table": "t", "partitions": 1, "max_wait_ms": 300}))
        .await
        .unwrap();
    f.read_all(&info).await;
    use tonic::Code::*;
    let cases: Vec<(&str, &str, tonic::Code, &str)> = vec![
        ("drop_queue", "{}", InvalidArgument, "unknown action"),
        ("commit", "{", InvalidArgument, "not valid JSON"),
        ("commit", r#"{"table":"t"}"#, InvalidArgument, "`batch`"),
        (
            "commit",
            r#"{"table":"t","batch":-1}"#,
            InvalidArgument,
            "`batch`",
        ),
        (
            "commit",
            r#"{"table":"t","batch":1,"x":1}"#,
            InvalidArgument,
            "`x`",
        ),
        ("commit", r#"{"table":"nope","batch":1}"#, NotFound, "nope"),
        ("release", r#"{"consumer":"c"}"#, InvalidArgument, "`table`"),
        ("release", r#"{"table":"nope"}"#, NotFound, "nope"),
        ("status", r#"{"table":"nope"}"#, NotFound, "nope"),
        ("status", r#"{"table":1}"#, InvalidArgument, "`table`"),
    ];
    for (kind, body, code, needle) in cases {
        let err = match f.action_raw(kind, body).await {
            Result::Err(e) => e,
            Result::Ok(v) => panic!("{kind} {body} succeeded: {v}"),
        };
        assert_eq!(err.code(), code, "{kind} {body}: {err}");
        assert!(err.message().contains(needle), "{kind} {body}: {err}");
    }
    assert_eq!(
        f.counts().await,
        (0, 2),
        "still held, nothing deleted or released"
    );
    assert_eq!(f.commit("default", 1).await["deleted"], 2);
}

/// A Flight SQL `Any` of `type_url` whose value is not that message.
fn undecodable(type_url: &str) -> Vec<u8> {
    use prost::Message;
    let value = vec![0xff; 7];
    arrow_flight::sql::Any {
        type_url: type_url.into(),
        value: value.into(),
    }
    .encode_to_vec()
}

#[tokio::test]
async fn undecodable_flight_sql_messages_are_invalid_argument_everywhere() {
    use arrow_flight::Action;
    use futures::TryStreamExt;
    let mut f = Fixture::standard(2).await;
    let sql = "type.googleapis.com/arrow.flight.protocol.sql.";
    let statement = undecodable(&format!("{sql}CommandStatementQuery"));
    let ticket = undecodable(&format!("{sql}TicketStatementQuery"));
    let create = undecodable(&format!("{sql}ActionCreatePreparedStatementRequest"));
    let unknown = undecodable(&format!("{sql}{}", "Nope".repeat(100_000)));
    let mut answers = Vec::new();
    for cmd in [&statement, &unknown] {
        let d = FlightDescriptor::new_cmd(cmd.clone());
        answers.push((
            "GetFlightInfo",
            bounded(f.flight.get_flight_info(d.clone())).await.err(),
        ));
        answers.push(("GetSchema", bounded(f.flight.get_schema(d)).await.err()));
    }
    for t in [&ticket, &statement, &unknown] {
        let got = bounded(f.flight.do_get(Ticket::new(t.clone()))).await;
        answers.push(("DoGet", got.err()));
    }
    for body in [&create, &unknown] {
        let action = Action::new("CreatePreparedStatement", body.clone());
        let got = bounded(async {
            f.flight
                .do_action(action)
                .await?
                .try_collect::<Vec<_>>()
                .await
        });
        answers.push(("DoAction", got.await.err()));
    }
    for (rpc, answer) in answers {
        let err = status(answer.unwrap_or_else(|| panic!("{rpc} accepted an undecodable message")));
        assert_eq!(err.code(), tonic::Code::InvalidArgument, "{rpc}: {err}");
        assert!(
            err.message().len() < 512,
            "{rpc}: a {} byte message",
            err.message().len()
        );
    }
    assert_eq!(f.counts().await, (2, 0), "the queue is untouched");
}

#[tokio::test]
async fn a_megabyte_of_sql_is_refused_with_a_short_message() {
    use arrow_flight::sql::{CommandStatementQuery, ProstMessageExt, TicketStatementQuery};
    use prost::Message;
    let mut f = Fixture::standard(2).await;
    let big = format!("SELECT * FROM {}", "x".repeat(1 << 20));
    let cmd = CommandStatementQuery {
        query: big.clone(),
        transaction_id: None,
    };
    let d = FlightDescriptor::new_cmd(cmd.as_any().encode_to_vec());
    let err = status(bounded(f.flight.get_flight_info(d)).await.unwrap_err());
    assert_eq!(err.code(), tonic::Code::NotFound, "{:.300}", err.message());
    assert!(
        err.message().len() < 1024,
        "a {} byte message",
        err.message().len()
    );
    assert!(err.message().contains("xxxx"), "{}", err.message());
    let ticket = TicketStatementQuery {
        statement_handle: big.into_bytes().into(),
    };
    let err = status(
        bounded(
            f.flight
                .do_get(Ticket::new(ticket.as_any().encode_to_vec())),
        )
        .await
        .unwrap_err(),
    );
    assert_eq!(err.code(), tonic::Code::NotFound, "{:.300}", err.message());
    assert!(
        err.message().len() < 1024,
        "a {} byte message",
        err.message().len()
    );
    assert_eq!(f.counts().await, (2, 0), "the queue is untouched");
}
