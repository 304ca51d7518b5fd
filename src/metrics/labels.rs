//! The fixed label values of weir's series, pre-created at zero.

/// weir's own error codes (the `error` label of `weir_requests_total`),
/// each with the HTTP status weir answers it with (its `code` label) and
/// whether it is a refusal: an answer weir gave without asking the
/// upstream, which takes no place in `weir_request_duration_seconds`.
/// `proxy::error` keeps the same table (a test there holds them equal).
pub const ERROR_CODES: [(&str, &str, bool); 17] = [
    ("no_route", "404", true),
    ("bad_request", "400", true),
    ("header_too_large", "431", true),
    ("connect_not_allowed", "405", true),
    ("bad_response", "502", false),
    ("rate_limited", "429", true),
    ("overloaded", "503", true),
    ("circuit_open", "503", true),
    ("connect_failed", "502", false),
    ("refused_stream", "502", false),
    ("upstream_reset", "502", false),
    ("upstream_timeout", "504", false),
    ("deadline_exceeded", "504", false),
    ("idempotency_in_flight", "409", true),
    ("idempotency_key_reused", "422", true),
    ("idempotency_not_replayable", "409", true),
    ("state_unavailable", "503", true),
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
