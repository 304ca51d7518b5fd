//! `weir decide`'s input: arbitrary JSON never panics the decision core,
//! and a verdict it gives is valid JSON of the contract's shape.
#![no_main]

use libfuzzer_sys::fuzz_target;
use weir::policy::{decide_json, DecisionInput};

fuzz_target!(|data: &[u8]| {
    let Ok(input) = serde_json::from_slice::<DecisionInput>(data) else {
        return;
    };
    if let Ok(verdict) = decide_json(&input) {
        let v = serde_json::to_value(verdict).expect("a verdict serialises");
        assert_eq!(v["contract_version"], 1);
        assert!(v["decision"].is_string(), "{v}");
    }
});
