//! The idempotency fixture matrix (docs/reference/idempotency.md#idempotency-keys): every
//! `tests/fixtures/idempotency/*.json` is `{ "description", "input",
//! "expected" }` of one of three kinds, told apart by `input`:
//!
//! - `{ "record", "request", "now_ms" }` → `{ "action", "status"?, "error"?,
//!   "retry_after_s"? }`: [`decide`] on a key's record (`null`: none);
//! - `{ "ending" }` → `{ "record" }`: what the end of an exchange records
//!   ([`record`]);
//! - `{ "params", "steps" }` → `{ "stats" }`: a sequence of `begin`,
//!   `finish` and `sweep` on a [`MemoryStore`], each `begin` with the action
//!   it must get, and the store's counters at the end (each field given must
//!   equal). These hold for any [`IdempotencyStore`].
//!
//! Together they must cover every action and every record outcome.
#![allow(clippy::unwrap_used)]

use crate::common::fixtures;

use serde::Deserialize;
use serde_json::Value;
use std::collections::BTreeSet;
use std::time::Duration;
use weir::policy::idempotency::{
    decide, record, Action, Ending, Entry, EntryState, Fingerprint, IdempotencyParams,
    IdempotencyStore, MemoryStore, Record, StoredResponse,
};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Request {
    method: String,
    target: String,
    #[serde(default)]
    body: String,
}

impl Request {
    fn fingerprint(&self) -> Fingerprint {
        Fingerprint::new(&self.method, &self.target, self.body.as_bytes())
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Response {
    status: u16,
    #[serde(default)]
    headers: Vec<(String, String)>,
    #[serde(default)]
    body: String,
}

impl Response {
    fn stored(&self) -> StoredResponse {
        StoredResponse::new(
            self.status,
            self.headers
                .iter()
                .map(|(n, v)| (n.as_bytes(), v.as_bytes())),
            self.body.as_bytes(),
        )
    }
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "snake_case")]
enum StateName {
    InFlight,
    Uncertain,
    Completed,
    CompletedNotReplayable,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RecordIn {
    state: StateName,
    request: Request,
    expires_ms: u64,
    #[serde(default)]
    since_ms: u64,
    #[serde(default)]
    response: Option<Response>,
}

impl RecordIn {
    fn entry(&self, name: &str) -> Entry {
        let state = match self.state {
            StateName::InFlight => EntryState::InFlight {
                since: ms(self.since_ms),
            },
            StateName::Uncertain => EntryState::Uncertain,
            StateName::Completed => {
                let r = self.response.as_ref();
                let r = r.unwrap_or_else(|| panic!("{name}: a completed record needs a response"));
                EntryState::Completed(r.stored())
            }
            StateName::CompletedNotReplayable => EntryState::CompletedNotReplayable,
        };
        Entry::new(self.request.fingerprint(), state, ms(self.expires_ms))
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct DecideIn {
    record: Option<RecordIn>,
    request: Request,
    now_ms: u64,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RecordCase {
    ending: Ending,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Params {
    ttl_ms: u64,
    max_bytes: u64,
    max_response_bytes: u64,
}

#[derive(Debug, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
enum Step {
    Begin {
        at_ms: u64,
        key: String,
        request: Request,
        expect: String,
    },
    Finish {
        at_ms: u64,
        key: String,
        ending: Ending,
        #[serde(default)]
        response: Option<Response>,
    },
    Sweep {
        at_ms: u64,
    },
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Steps {
    params: Params,
    steps: Vec<Step>,
}

fn ms(x: u64) -> Duration {
    Duration::from_millis(x)
}

/// What a fixture saw: the actions and record outcomes, for coverage.
#[derive(Default)]
struct Seen {
    actions: BTreeSet<String>,
    records: BTreeSet<String>,
    failures: Vec<String>,
}

impl Seen {
    fn check(&mut self, name: &str, expected: &Value, actual: &Value) {
        let (Some(want), Some(got)) = (expected.as_object(), actual.as_object()) else {
            panic!("{name}: expected and actual must be objects");
        };
        for (k, v) in want {
            if got.get(k) != Some(v) {
                self.failures
                    .push(format!("{name}: {k}: expected {v}, got {actual}"));
            }
        }
    }

    fn decide(&mut self, name: &str, input: DecideIn, expected: &Value) {
        let entry = input.record.as_ref().map(|r| r.entry(name));
        let fp = input.request.fingerprint();
        let action = decide(entry.as_ref(), &fp, ms(input.now_ms));
        let mut actual = serde_json::json!({ "action": action.name() });
        if let Action::Replay(r) = &action {
            actual["status"] = r.status.into();
        }
        if let Some((status, code)) = action.refusal() {
            actual["status"] = status.into();
            actual["error"] = code.into();
        }
        if let Some(after) = action.retry_after() {
            actual["retry_after_s"] = after.as_secs().into();
        }
        self.actions.insert(action.name().to_string());
        self.check(name, expected, &actual);
    }

    fn record(&mut self, name: &str, input: RecordCase, expected: &Value) {
        let r = record(input.ending);
        let actual = serde_json::json!({ "record": r });
        self.records
            .insert(actual["record"].as_str().unwrap().to_string());
        self.check(name, expected, &actual);
    }

    fn steps(&mut self, name: &str, input: Steps, expected: &Value) {
        let p = &input.params;
        let methods = ["POST".to_string(), "PATCH".to_string()];
        let params =
            IdempotencyParams::try_new(ms(p.ttl_ms), p.max_bytes, p.max_response_bytes, &methods)
                .unwrap_or_else(|e| panic!("{name}: params: {e}"));
        let mut store: Box<dyn IdempotencyStore> = Box::new(MemoryStore::new(params));
        for (n, step) in input.steps.iter().enumerate() {
            match step {
                Step::Begin {
                    at_ms,
                    key,
                    request,
                    expect,
                } => {
                    let got = store.begin(key, &request.fingerprint(), ms(*at_ms));
                    if got.name() != expect {
                        self.failures.push(format!(
                            "{name}: step {n}: expected {expect}, got {}",
                            got.name()
                        ));
                    }
                    self.actions.insert(got.name().to_string());
                }
                Step::Finish {
                    at_ms,
                    key,
                    ending,
                    response,
                } => {
                    let r = response.as_ref().map(Response::stored);
                    store.finish(key, record(*ending), r, ms(*at_ms));
                }
                Step::Sweep { at_ms } => store.sweep(ms(*at_ms)),
            }
        }
        let stats = serde_json::to_value(store.stats()).unwrap();
        self.check(name, &expected["stats"], &stats);
    }
}

#[test]
fn idempotency_fixtures() {
    let fixtures = fixtures::load("idempotency", 20);

    let mut seen = Seen::default();
    for (name, doc) in fixtures {
        assert!(doc["description"].is_string(), "{name}: no description");
        let input = doc["input"].clone();
        let expected = &doc["expected"];
        if input.get("ending").is_some() {
            let i = serde_json::from_value(input).unwrap_or_else(|e| panic!("{name}: {e}"));
            seen.record(&name, i, expected);
        } else if input.get("steps").is_some() {
            let i = serde_json::from_value(input).unwrap_or_else(|e| panic!("{name}: {e}"));
            seen.steps(&name, i, expected);
        } else if input.get("request").is_some() {
            let i = serde_json::from_value(input).unwrap_or_else(|e| panic!("{name}: {e}"));
            seen.decide(&name, i, expected);
        } else {
            panic!("{name}: input has no `ending`, `steps` or `request`");
        }
    }
    assert!(seen.failures.is_empty(), "{}", seen.failures.join("\n"));
    for a in ["forward", "in_flight", "replay", "reused", "not_replayable"] {
        assert!(seen.actions.contains(a), "no fixture decides {a}");
    }
    for r in [
        Record::Completed,
        Record::CompletedNotReplayable,
        Record::Forget,
        Record::Uncertain,
    ] {
        let r = serde_json::to_value(r).unwrap();
        let r = r.as_str().unwrap();
        assert!(seen.records.contains(r), "no fixture records {r}");
    }
}

/// The fixtures' shapes refuse what they do not know, like `weir decide`'s.
#[test]
fn unknown_fields_are_refused() {
    let r: Result<RecordCase, _> = serde_json::from_value(serde_json::json!({
        "ending": { "kind": "response", "status": 200, "replayable": true, "trailers": 1 }
    }));
    assert!(r.is_err());
    let r: Result<Step, _> = serde_json::from_value(serde_json::json!({
        "op": "sweep", "at_ms": 0, "key": "k"
    }));
    assert!(r.is_err());
}
