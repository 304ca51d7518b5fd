//! The fixed label values of weir's series, pre-created at zero.

/// weir's own error codes, the `code` label values that are not statuses.
pub const ERROR_CODES: [&str; 15] = [
    "no_route",
    "bad_request",
    "header_too_large",
    "connect_not_allowed",
    "bad_response",
    "rate_limited",
    "overloaded",
    "circuit_open",
    "connect_failed",
    "upstream_reset",
    "upstream_timeout",
    "deadline_exceeded",
    "idempotency_in_flight",
    "idempotency_key_reused",
    "idempotency_not_replayable",
];

/// The `result` label values of `weir_upstream_attempts_total`.
pub const ATTEMPT_RESULTS: [&str; 9] = [
    "ok",
    "status_4xx",
    "status_5xx",
    "connect_failure",
    "reset",
    "timeout",
    "refused_stream",
    "bad_response",
    "cancelled",
];

/// The `error` label values of `weir_upstream_body_errors_total`: a
/// relayed body that ended early, was reset or broke its framing, or went
/// idle past `idle_timeout`.
pub const BODY_ERRORS: [&str; 2] = ["upstream_reset", "upstream_timeout"];
