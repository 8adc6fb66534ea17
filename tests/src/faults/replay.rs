//! The proxy's at-least-once rules: duplicate receives and redeliveries of
//! deleted messages (see the parent module's doc). Everything here runs
//! under the proxy's lock, so the seeded draws stay in call order.

use std::collections::{HashMap, HashSet, VecDeque};

use bytes::Bytes;
use hyper::StatusCode;
use serde_json::{Value, json};

use super::{DUPLICATED, NEW_RECEIPT, REDELIVERED, REDELIVERED_RECEIPT, STALE_RECEIPT, State};

const RECEIVE: &str = "ReceiveMessage";

/// What the rules remember.
#[derive(Default)]
pub(super) struct Replays {
    /// Every receipt handed out while a rule was on, as the client got it:
    /// its queue URL and message.
    handed: HashMap<String, (String, Value)>,
    /// The made-up receipt of a duplicate: the emulator's receipt it stands for.
    made_up: HashMap<String, String>,
    /// Receipts a newer delivery of their message superseded.
    superseded: HashSet<String>,
    /// The made-up receipts of redelivered deleted messages.
    ghosts: HashSet<String>,
    /// Per queue URL, the messages to hand again, oldest first.
    pending: HashMap<String, VecDeque<Again>>,
    /// Ids drawn for a duplicate, and for a redelivery: once each.
    to_duplicate: HashSet<String>,
    to_redeliver: HashSet<String>,
    /// Ids handed a second time by the duplicate rule.
    pub(super) duplicated_out: HashSet<String>,
    /// Ids whose delete the emulator confirmed.
    deleted: HashSet<String>,
    /// Receipts made up so far.
    made: u64,
    /// (queue URL, emulator's receipt, visibility timeout) of the messages
    /// just handed a second time, whose visibility is to restart.
    restarts: Vec<(String, String, i64)>,
}

/// A message to hand again.
pub(super) struct Again {
    message: Value,
    /// The receipt this delivery supersedes (a duplicate), or none (a
    /// redelivery of a deleted message).
    supersedes: Option<String>,
}

/// What is left to do for one call once it has been routed.
pub(super) enum Replay {
    Nothing,
    /// Answered here, unforwarded, with this.
    Answered(Value),
    /// A ReceiveMessage: its queue, the most messages it asked for, and the
    /// messages handed again that take part of that room.
    Receive {
        queue: String,
        max: usize,
        visibility: Option<i64>,
        again: Vec<Again>,
    },
    /// A delete: (entry id, receipt as the client sent it) of each entry
    /// forwarded; no id for a DeleteMessage.
    Delete(Vec<(Option<String>, String)>),
}

enum Route {
    /// Answered here as a success, counted under this key.
    Here(&'static str),
    /// Forwarded as this receipt of the emulator's.
    As(String),
    Pass,
}

impl Replays {
    /// The visibility restarts owed to the emulator (see [`hand`]).
    pub(super) fn take_restarts(&mut self) -> Vec<(String, String, i64)> {
        std::mem::take(&mut self.restarts)
    }

    fn route(&self, handle: &str) -> Route {
        if self.superseded.contains(handle) {
            Route::Here(STALE_RECEIPT)
        } else if self.ghosts.contains(handle) {
            Route::Here(REDELIVERED_RECEIPT)
        } else if let Some(upstream) = self.made_up.get(handle) {
            Route::As(upstream.clone())
        } else {
            Route::Pass
        }
    }

    /// Up to `n` messages to hand again to a receive of `queue`; duplicates
    /// of messages deleted meanwhile are dropped.
    fn take(&mut self, queue: &str, n: usize) -> Vec<Again> {
        let Some(waiting) = self.pending.get_mut(queue) else {
            return Vec::new();
        };
        let mut out = Vec::new();
        while out.len() < n {
            let Some(again) = waiting.pop_front() else {
                break;
            };
            let gone = again.supersedes.is_some() && self.deleted.contains(&id(&again.message));
            if !gone {
                out.push(again);
            }
        }
        out
    }
}

/// The message id of a received message.
fn id(message: &Value) -> String {
    message["MessageId"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

/// Routes the receipts of a call through the rules, and takes messages to
/// hand again for a receive: the body to forward, the entries answered here
/// as successes, and what to do with the emulator's answer.
pub(super) fn route(s: &mut State, op: &str, body: Bytes) -> (Bytes, Vec<Value>, Replay) {
    let remembered = !s.replays.handed.is_empty();
    match op {
        "ReceiveMessage" => receive(s, body),
        "DeleteMessageBatch" | "ChangeMessageVisibilityBatch" if remembered => batch(s, op, body),
        "DeleteMessage" | "ChangeMessageVisibility" if remembered => single(s, op, body),
        _ => (body, Vec::new(), Replay::Nothing),
    }
}

fn receive(s: &mut State, body: Bytes) -> (Bytes, Vec<Value>, Replay) {
    let waiting = s.replays.pending.values().any(|q| !q.is_empty());
    if s.faults.duplicate <= 0.0 && s.faults.redeliver <= 0.0 && !waiting {
        return (body, Vec::new(), Replay::Nothing);
    }
    let Ok(mut request) = serde_json::from_slice::<Value>(&body) else {
        return (body, Vec::new(), Replay::Nothing);
    };
    let queue = request["QueueUrl"].as_str().unwrap_or_default().to_string();
    let max = request["MaxNumberOfMessages"]
        .as_u64()
        .unwrap_or(1)
        .clamp(1, 10) as usize;
    let visibility = request["VisibilityTimeout"].as_i64();
    let again = s.replays.take(&queue, max);
    if again.len() == max {
        let messages: Vec<Value> = again
            .into_iter()
            .map(|a| hand(s, &queue, visibility, a))
            .collect();
        let answer = json!({"Messages": messages});
        return (body, Vec::new(), Replay::Answered(answer));
    }
    let body = if again.is_empty() {
        body
    } else {
        // SQS answers at once when it has messages: no long poll.
        request["MaxNumberOfMessages"] = json!(max - again.len());
        request["WaitTimeSeconds"] = json!(0);
        Bytes::from(request.to_string())
    };
    let replay = Replay::Receive {
        queue,
        max,
        visibility,
        again,
    };
    (body, Vec::new(), replay)
}

fn batch(s: &mut State, op: &str, body: Bytes) -> (Bytes, Vec<Value>, Replay) {
    let Ok(mut request) = serde_json::from_slice::<Value>(&body) else {
        return (body, Vec::new(), Replay::Nothing);
    };
    let Some(Value::Array(entries)) = request.get_mut("Entries").map(std::mem::take) else {
        return (body, Vec::new(), Replay::Nothing);
    };
    let (mut keep, mut here, mut forwarded) = (Vec::new(), Vec::new(), Vec::new());
    for mut entry in entries {
        let handle = entry["ReceiptHandle"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        match s.replays.route(&handle) {
            Route::Here(kind) => {
                s.count(op, kind, 1);
                here.push(json!({"Id": entry["Id"]}));
                continue;
            }
            Route::As(upstream) => {
                s.count(op, NEW_RECEIPT, 1);
                entry["ReceiptHandle"] = json!(upstream);
            }
            Route::Pass => {}
        }
        let entry_id = entry["Id"].as_str().map(str::to_string);
        forwarded.push((entry_id, handle));
        keep.push(entry);
    }
    request["Entries"] = Value::Array(keep);
    let replay = if op == "DeleteMessageBatch" {
        Replay::Delete(forwarded)
    } else {
        Replay::Nothing
    };
    (Bytes::from(request.to_string()), here, replay)
}

fn single(s: &mut State, op: &str, body: Bytes) -> (Bytes, Vec<Value>, Replay) {
    let Ok(mut request) = serde_json::from_slice::<Value>(&body) else {
        return (body, Vec::new(), Replay::Nothing);
    };
    let handle = request["ReceiptHandle"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let body = match s.replays.route(&handle) {
        Route::Here(kind) => {
            s.count(op, kind, 1);
            return (body, Vec::new(), Replay::Answered(json!({})));
        }
        Route::As(upstream) => {
            s.count(op, NEW_RECEIPT, 1);
            request["ReceiptHandle"] = json!(upstream);
            Bytes::from(request.to_string())
        }
        Route::Pass => body,
    };
    let replay = if op == "DeleteMessage" {
        Replay::Delete(vec![(None, handle)])
    } else {
        Replay::Nothing
    };
    (body, Vec::new(), replay)
}

/// Hands `again` out once more, under a receipt made up for it. A
/// duplicate's visibility restarts with this delivery, as SQS restarts it
/// at each one, for the receive's `visibility` timeout (the proxy owes the
/// emulator that call: [`Replays::take_restarts`]).
fn hand(s: &mut State, queue: &str, visibility: Option<i64>, again: Again) -> Value {
    s.replays.made += 1;
    let mut message = again.message;
    let handle = match again.supersedes {
        Some(old) => {
            let handle = format!("sqsf-fault-proxy-duplicate-{}", s.replays.made);
            let upstream = s.replays.made_up.get(&old).cloned().unwrap_or(old.clone());
            if let Some(timeout) = visibility {
                s.replays
                    .restarts
                    .push((queue.to_string(), upstream.clone(), timeout));
            }
            s.replays.made_up.insert(handle.clone(), upstream);
            s.replays.superseded.insert(old);
            s.replays.duplicated_out.insert(id(&message));
            s.count(RECEIVE, DUPLICATED, 1);
            handle
        }
        None => {
            let handle = format!("sqsf-fault-proxy-redelivered-{}", s.replays.made);
            s.replays.ghosts.insert(handle.clone());
            s.count(RECEIVE, REDELIVERED, 1);
            handle
        }
    };
    message["ReceiptHandle"] = json!(handle);
    // Each delivery counts, as SQS counts it.
    let count = message["Attributes"]["ApproximateReceiveCount"]
        .as_str()
        .and_then(|n| n.parse::<u64>().ok());
    if let Some(n) = count {
        message["Attributes"]["ApproximateReceiveCount"] = json!((n + 1).to_string());
    }
    s.replays
        .handed
        .insert(handle, (queue.to_string(), message.clone()));
    message
}

impl Replay {
    /// The answer to give without forwarding, if nothing is left to forward.
    pub(super) fn local_answer(
        &self,
        body: &Bytes,
        failed: &[Value],
        succeeded: &[Value],
    ) -> Option<Value> {
        if let Replay::Answered(answer) = self {
            return Some(answer.clone());
        }
        let nothing_left = (!failed.is_empty() || !succeeded.is_empty())
            && serde_json::from_slice::<Value>(body)
                .is_ok_and(|v| v["Entries"].as_array().is_some_and(Vec::is_empty));
        nothing_left.then(|| json!({"Successful": succeeded, "Failed": failed}))
    }

    /// Applies the rules to the emulator's answer to the forwarded call.
    pub(super) fn finish(self, s: &mut State, status: StatusCode, body: Bytes) -> Bytes {
        if !status.is_success() {
            self.abandon(s);
            return body;
        }
        match self {
            Replay::Receive {
                queue,
                max,
                visibility,
                again,
            } => received(s, &queue, max, visibility, again, body),
            Replay::Delete(entries) => {
                deleted(s, &entries, &body);
                body
            }
            Replay::Nothing | Replay::Answered(_) => body,
        }
    }

    /// The forwarded call failed: messages taken to hand again wait for the
    /// next receive.
    pub(super) fn abandon(self, s: &mut State) {
        if let Replay::Receive { queue, again, .. } = self {
            let waiting = s.replays.pending.entry(queue).or_default();
            for a in again.into_iter().rev() {
                waiting.push_front(a);
            }
        }
    }
}

/// The emulator's answer to a receive, with the messages handed again
/// added; the messages it carries are remembered, and some drawn for a
/// duplicate.
fn received(
    s: &mut State,
    queue: &str,
    max: usize,
    visibility: Option<i64>,
    mut again: Vec<Again>,
    body: Bytes,
) -> Bytes {
    let Ok(mut answer) = serde_json::from_slice::<Value>(&body) else {
        Replay::Receive {
            queue: queue.to_string(),
            max,
            visibility,
            again,
        }
        .abandon(s);
        return body;
    };
    let mut messages = match answer.get_mut("Messages").map(std::mem::take) {
        Some(Value::Array(m)) => m,
        _ => Vec::new(),
    };
    // Duplicates other calls queued while this one was in flight fill what
    // room is left: the same message, to two receives at once.
    let room = max.saturating_sub(messages.len() + again.len());
    again.extend(s.replays.take(queue, room));
    for message in &messages {
        let handle = message["ReceiptHandle"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let message_id = id(message);
        let draw = s.faults.duplicate > 0.0
            && !s.replays.to_duplicate.contains(&message_id)
            && s.unit() < s.faults.duplicate;
        if draw {
            s.replays.to_duplicate.insert(message_id);
            let again = Again {
                message: message.clone(),
                supersedes: Some(handle.clone()),
            };
            s.replays
                .pending
                .entry(queue.to_string())
                .or_default()
                .push_back(again);
        }
        s.replays
            .handed
            .insert(handle, (queue.to_string(), message.clone()));
    }
    for a in again {
        messages.push(hand(s, queue, visibility, a));
    }
    if messages.is_empty() {
        return body;
    }
    answer["Messages"] = Value::Array(messages);
    Bytes::from(answer.to_string())
}

/// Remembers the deletes the emulator confirmed; some are drawn for a
/// redelivery.
fn deleted(s: &mut State, entries: &[(Option<String>, String)], body: &Bytes) {
    let confirmed: Vec<&String> = match entries {
        [(None, handle)] => vec![handle],
        _ => {
            let answer: Value = serde_json::from_slice(body).unwrap_or_default();
            let ok: HashSet<&str> = answer["Successful"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|e| e["Id"].as_str())
                .collect();
            entries
                .iter()
                .filter(|(entry_id, _)| entry_id.as_deref().is_some_and(|i| ok.contains(i)))
                .map(|(_, handle)| handle)
                .collect()
        }
    };
    for handle in confirmed {
        let Some((queue, message)) = s.replays.handed.get(handle).cloned() else {
            continue;
        };
        let message_id = id(&message);
        s.replays.deleted.insert(message_id.clone());
        let draw = s.faults.redeliver > 0.0
            && !s.replays.to_redeliver.contains(&message_id)
            && s.unit() < s.faults.redeliver;
        if draw {
            s.replays.to_redeliver.insert(message_id);
            let again = Again {
                message,
                supersedes: None,
            };
            s.replays.pending.entry(queue).or_default().push_back(again);
        }
    }
}
