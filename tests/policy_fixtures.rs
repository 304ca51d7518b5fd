//! The decision fixture matrix: every `tests/fixtures/decisions/*.json` is
//! `{ "description", "input": DecisionInput, "expected": partial VerdictJson }`.
//! Each field of `expected` must equal the verdict's; together the fixtures
//! must cover every stop reason of docs/reference/retries.md#the-retry-decision.
#![allow(clippy::unwrap_used)]

use crate::common::fixtures;

use serde_json::Value;
use std::collections::BTreeSet;
use weir::policy::{decide_json, DecisionInput, StopReason};

#[test]
fn decision_fixtures() {
    let fixtures = fixtures::load("decisions", 25);

    let mut failures = Vec::new();
    let mut reasons = BTreeSet::new();
    let mut decisions = BTreeSet::new();
    for (name, doc) in fixtures {
        let input: DecisionInput = serde_json::from_value(doc["input"].clone())
            .unwrap_or_else(|e| panic!("{name}: input: {e}"));
        let expected = doc["expected"]
            .as_object()
            .unwrap_or_else(|| panic!("{name}: no expected"));
        assert!(
            expected.contains_key("decision"),
            "{name}: expected has no decision"
        );
        let verdict = decide_json(&input).unwrap_or_else(|e| panic!("{name}: {e}"));
        let actual = serde_json::to_value(verdict).unwrap();
        for (k, v) in expected {
            if actual.get(k) != Some(v) {
                failures.push(format!("{name}: {k}: expected {v}, got {actual}"));
            }
        }
        decisions.insert(actual["decision"].as_str().unwrap().to_string());
        if let Some(r) = actual.get("reason").and_then(Value::as_str) {
            reasons.insert(r.to_string());
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    for r in StopReason::ALL {
        assert!(reasons.contains(r.as_str()), "no fixture stops with {r}");
    }
    for d in ["retry", "stop", "not_retryable", "cancelled"] {
        assert!(decisions.contains(d), "no fixture decides {d}");
    }
}

#[test]
fn other_contract_versions_are_refused() {
    let input: DecisionInput = serde_json::from_value(serde_json::json!({
        "contract_version": 2,
        "request": { "method": "GET" },
        "attempts_made": 1,
        "outcome": { "kind": "timeout" }
    }))
    .unwrap();
    assert_eq!(decide_json(&input).unwrap_err().field, "contract_version");
}

#[test]
fn unknown_fields_are_refused() {
    let r: Result<DecisionInput, _> = serde_json::from_value(serde_json::json!({
        "contract_version": 1,
        "request": { "method": "GET", "idempotencykey": true },
        "attempts_made": 1,
        "outcome": { "kind": "timeout" }
    }));
    assert!(r.is_err());
}
