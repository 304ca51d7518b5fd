//! An upstream's policy tables: merged (its own over `[defaults]` over the
//! built-ins, with the defaults that follow another field adjusted), then
//! validated — retry, backoff, budget, breaker, rate limit, idempotency and
//! cache, each into its typed parameters, with every error located in the
//! file.

use super::super::duration;
use super::super::raw::{RawJitter, RawPolicy};
use super::ErrorSink;
use crate::policy::{
    BackoffPolicy, BreakerParams, BudgetParams, CacheParams, Growth, HedgeParams,
    IdempotencyParams, Jitter, RateLimitParams, RetryOn, RetryPolicy, Scope,
};

/// An upstream's policy: its own fields (`own`) over `[defaults]`
/// (`raw_defaults` as written, `defaults` merged over the built-ins). A
/// default that follows another field is adjusted when the user set it
/// nowhere (see [`open_within_default_max`], [`response_within_max_bytes`],
/// [`object_within_max_bytes`]); a `rate_limit` table gets its fields'
/// defaults.
pub(super) fn merged(own: RawPolicy, raw_defaults: &RawPolicy, defaults: RawPolicy) -> RawPolicy {
    let written = [&own, raw_defaults];
    let max_open_set = written
        .iter()
        .any(|p| p.breaker.as_ref().is_some_and(|b| b.max_open.is_some()));
    let response_set = written.iter().any(|p| {
        let i = p.idempotency.as_ref();
        i.is_some_and(|i| i.max_response_bytes.is_some())
    });
    let object_set = written.iter().any(|p| {
        let c = p.cache.as_ref();
        c.is_some_and(|c| c.max_object_bytes.is_some())
    });
    let mut merged = own.merge(defaults);
    if !max_open_set {
        open_within_default_max(&mut merged);
    }
    if !response_set {
        response_within_max_bytes(&mut merged);
    }
    if !object_set {
        object_within_max_bytes(&mut merged);
    }
    if let Some(rl) = merged.rate_limit.take() {
        merged.rate_limit = Some(rl.merge(RawPolicy::builtin_rate_limit()));
    }
    if let Some(h) = merged.hedge.take() {
        merged.hedge = Some(h.merge(super::super::raw::RawHedge::builtin()));
    }
    merged
}

pub(super) fn retry_policy(cx: &mut ErrorSink, name: &str, p: &RawPolicy) -> Option<RetryPolicy> {
    let r = p.retry.clone().unwrap_or_default();
    let b = r.backoff.clone().unwrap_or_default();
    let bu = r.budget.clone().unwrap_or_default();
    let dur = |d: Option<duration::Dur>| d.map(|d| d.0).unwrap_or_default();

    let growth = match b.growth.as_deref().unwrap_or("exponential") {
        "exponential" => Some(Growth::Exponential),
        "linear" => Some(Growth::Linear),
        "constant" => Some(Growth::Constant),
        other => {
            let f = cx.policy_path(name, "retry.backoff.growth");
            cx.err(
                f,
                format!("unknown growth {other:?}: expected exponential, linear or constant"),
            );
            None
        }
    };
    let jitter = match b.jitter.clone().unwrap_or(RawJitter::Name("full".into())) {
        RawJitter::Name(n) => match n.as_str() {
            "full" => Some(Jitter::Full),
            "equal" => Some(Jitter::Equal),
            "decorrelated" => Some(Jitter::Decorrelated),
            "none" => Some(Jitter::None),
            other => {
                let f = cx.policy_path(name, "retry.backoff.jitter");
                cx.err(f, format!(
                    "unknown jitter {other:?}: expected full, equal, decorrelated, none or {{ proportional = 0.2 }}"
                ));
                None
            }
        },
        RawJitter::Proportional(p) => Some(Jitter::Proportional(p.proportional)),
    };
    let backoff = match (growth, jitter) {
        (Some(g), Some(j)) => BackoffPolicy::try_new(
            dur(b.base),
            dur(b.max),
            b.multiplier.unwrap_or(2.0),
            g,
            j,
            b.allow_jitter_above_cap.unwrap_or(false),
        )
        .map_err(|e| cx.policy_err(name, "retry.backoff", e))
        .ok(),
        _ => None,
    };
    let budget = BudgetParams::try_new(
        bu.ratio.unwrap_or_default(),
        bu.min_per_sec.unwrap_or_default(),
        dur(bu.ttl),
        bu.timeout_cost.unwrap_or_default(),
    )
    .map_err(|e| cx.policy_err(name, "retry.budget", e))
    .ok();
    let retry_on = RetryOn::parse(r.retry_on.as_deref().unwrap_or_default())
        .map_err(|e| cx.policy_err(name, "retry", e))
        .ok();
    RetryPolicy::try_new(
        r.max_attempts.unwrap_or_default(),
        retry_on?,
        dur(r.max_retry_after),
        r.max_replay_body_bytes.unwrap_or_default(),
        dur(r.min_attempt_time),
        backoff?,
        budget?,
    )
    .map_err(|e| cx.policy_err(name, "retry", e))
    .ok()
}

/// `max_open` left at its default never undercuts an `open` the user set
/// above it: a config written for longer open intervals (`open = "1m"`) keeps
/// working, open for `open` each time, instead of failing validation on a
/// field it never mentioned.
fn open_within_default_max(p: &mut RawPolicy) {
    if let Some(b) = p.breaker.as_mut() {
        if let (Some(open), Some(max)) = (b.open, b.max_open) {
            if open.0 > max.0 {
                b.max_open = Some(open);
            }
        }
    }
}

/// `max_response_bytes` left at its default never exceeds a smaller
/// `max_bytes` the user set: a small store keeps working, with responses up
/// to its whole size replayable, instead of failing on a field never written.
fn response_within_max_bytes(p: &mut RawPolicy) {
    if let Some(i) = p.idempotency.as_mut() {
        if let (Some(max), Some(resp)) = (i.max_bytes, i.max_response_bytes) {
            i.max_response_bytes = Some(resp.min(max));
        }
    }
}

/// The cache's `max_object_bytes` left at its default likewise follows a
/// smaller `max_bytes`.
fn object_within_max_bytes(p: &mut RawPolicy) {
    if let Some(c) = p.cache.as_mut() {
        if let (Some(max), Some(obj)) = (c.max_bytes, c.max_object_bytes) {
            c.max_object_bytes = Some(obj.min(max));
        }
    }
}

pub(super) fn breaker(cx: &mut ErrorSink, name: &str, p: &RawPolicy) -> Option<BreakerParams> {
    let b = p.breaker.clone().unwrap_or_default();
    let (statuses, grpc) = failure_statuses(cx, name, b.failure_statuses.as_deref());
    BreakerParams::try_new(
        b.enabled.unwrap_or(true),
        b.consecutive_failures.unwrap_or_default(),
        b.window.unwrap_or_default(),
        b.min_samples.unwrap_or_default(),
        b.failure_rate.unwrap_or_default(),
        statuses,
        b.open.map(|d| d.0).unwrap_or_default(),
        b.max_open.map(|d| d.0).unwrap_or_default(),
        b.open_jitter.unwrap_or_default(),
        b.half_open_probes.unwrap_or_default(),
    )
    .map(|p| {
        p.with_scope(b.scope.unwrap_or(Scope::Fleet))
            .with_failing_for(b.failing_for.map(|d| d.0).unwrap_or_default())
            .with_grpc_failures(grpc)
    })
    .map_err(|e| cx.policy_errs(name, "breaker", e))
    .ok()
    .inspect(|p| held_back_note(cx, name, p))
}

/// `failure_statuses` split into HTTP statuses and gRPC codes; an unknown
/// code's name is an error naming the field.
fn failure_statuses(
    cx: &mut ErrorSink,
    name: &str,
    entries: Option<&[crate::config::raw::FailureStatus]>,
) -> (Vec<u16>, Vec<u8>) {
    use crate::config::raw::FailureStatus;
    let (mut statuses, mut grpc) = (Vec::new(), Vec::new());
    for e in entries.unwrap_or_default() {
        match e {
            FailureStatus::Http(s) => statuses.push(*s),
            FailureStatus::Grpc(n) => match crate::policy::grpc::code_named(n) {
                Some(c) => grpc.push(c),
                None => {
                    let at = cx.policy_path(name, "breaker.failure_statuses");
                    let names = crate::policy::grpc::CODES.iter().map(|(_, n, _)| *n);
                    cx.err(
                        at,
                        format!(
                            "{n:?} is neither an HTTP status nor a gRPC code: {}expected a number \
                             (500) or a gRPC code's name (unavailable, internal, …)",
                            crate::policy::suggest::hint(n, names)
                        ),
                    );
                }
            },
        }
    }
    (statuses, grpc)
}

/// An `open` the user set without `max_open`: until 2026-12-03 it doubled
/// up to 30 s; `max_open` now defaults to 320 ms and follows a longer
/// `open`, so the interval stays `open` (docs/reference/breaker.md#open).
fn no_longer_doubles_note(cx: &mut ErrorSink, name: &str, p: &BreakerParams) {
    let set = |f: &str| cx.policy_set(name, f);
    if !p.enabled || !set("breaker.open") || set("breaker.max_open") || p.open >= OLD_MAX_OPEN {
        return;
    }
    let at = cx.policy_path(name, "breaker.open");
    cx.note(
        &at,
        format!(
            "the open interval stays {} on every re-opening: `max_open` now defaults to \
             320 ms and follows a longer `open` (until 2026-12-03 it was 30s, and the \
             interval doubled up to it). Set `max_open = \"30s\"` for the doubling",
            super::super::duration::format(p.open)
        ),
    );
}

/// `timeout` or `per_try_timeout` the user set: since 2026-12-07 they no
/// longer count the time a request body takes to arrive
/// (docs/reference/deadlines.md#uploads). Said once where each is set (a
/// `[defaults]` field is shared by every upstream).
pub(super) fn uploads_note(cx: &mut ErrorSink, name: &str) {
    for field in ["timeout", "per_try_timeout"] {
        if !cx.policy_set(name, field) {
            continue;
        }
        let at = cx.policy_path(name, field);
        let message = format!(
            "`{field}` no longer counts the time the request body takes to arrive: it \
             stands still from weir's first read of the body to its last byte, while \
             `idle_timeout` bounds each gap and the client's own deadline still counts \
             (changed 2026-12-07; docs/reference/deadlines.md#uploads)"
        );
        if !cx
            .notes
            .iter()
            .any(|(_, n)| n.field == at && n.message == message)
        {
            cx.note(&at, message);
        }
    }
}

/// `rate_limit.scope = "fleet"` the user set: since 2026-12-07 an
/// instance leases longer batches while the fleet bucket is ample
/// (docs/reference/fleet.md#leased-tokens). Said once where it is set.
fn ample_batches_note(cx: &mut ErrorSink, name: &str) {
    let at = cx.policy_path(name, "rate_limit.scope");
    let message = "while the fleet bucket is ample (a whole grant that left an eighth of \
         `burst`), each instance now leases 3 s of its own demand at a time (at most an \
         eighth of `burst`, lasting 4 s) instead of 0.1 s (at least 10): a fleet of many \
         quiet sidecars costs Redis far less, and the fleet's admissions may run ahead of \
         the bucket by up to 1.5 such batches per instance (changed 2026-12-07; \
         docs/reference/fleet.md#leased-tokens)";
    if !cx
        .notes
        .iter()
        .any(|(_, n)| n.field == at && n.message == message)
    {
        cx.note(&at, message);
    }
}

/// `max_open`'s default until 2026-12-03.
const OLD_MAX_OPEN: std::time::Duration = std::time::Duration::from_secs(30);

/// A trip rule the user set that `failing_for` holds back: said by `weir
/// check`, so `consecutive_failures = 3` that does not open after three
/// quick failures is no surprise (docs/reference/breaker.md#trip-rules).
fn held_back_note(cx: &mut ErrorSink, name: &str, p: &BreakerParams) {
    no_longer_doubles_note(cx, name, p);
    if !p.enabled || p.failing_for.is_zero() || cx.policy_set(name, "breaker.failing_for") {
        return;
    }
    let wait = super::super::duration::format(p.failing_for);
    let rule = if cx.policy_set(name, "breaker.consecutive_failures") {
        Some((
            "breaker.consecutive_failures",
            format!("{} failures in a row", p.consecutive_failures),
        ))
    } else if cx.policy_set(name, "breaker.failure_rate") {
        Some((
            "breaker.failure_rate",
            format!("a failure share of {}", p.failure_rate),
        ))
    } else {
        None
    };
    if let Some((field, what)) = rule {
        let at = cx.policy_path(name, field);
        cx.note(
            &at,
            format!(
                "{what} opens the breaker only once no attempt has succeeded for \
                 `breaker.failing_for` ({wait}, the default): failures that come faster \
                 wait for it. Set `failing_for = \"0s\"` to open as soon as the rule holds"
            ),
        );
    }
}

pub(super) fn rate_limit(cx: &mut ErrorSink, name: &str, p: &RawPolicy) -> Option<RateLimitParams> {
    let r = p.rate_limit.as_ref()?;
    if r.scope == Some(Scope::Fleet) {
        ample_batches_note(cx, name);
    }
    let bucket = match (r.rps, r.burst) {
        (Some(rps), burst) => Some((rps, burst.unwrap_or_else(|| rps.ceil().max(1.0) as u32))),
        (None, Some(_)) => {
            cx.policy_err_given(
                name,
                "rate_limit.burst",
                &["rate_limit.rps"],
                "`burst` needs `rps`",
            );
            None
        }
        (None, None) => None,
    };
    let window = r.window.as_ref().map(|w| (w.limit, w.period.0));
    RateLimitParams::try_new(
        bucket,
        window,
        r.key.as_deref(),
        r.max_keys.unwrap_or_default() as usize,
        r.max_wait.map(|d| d.0).unwrap_or_default(),
    )
    .and_then(|p| p.with_scope(r.scope.unwrap_or(Scope::Instance), r.expected_instances))
    .map_err(|e| cx.policy_err(name, "rate_limit", e))
    .ok()
}

/// The idempotency store's parameters; `None` when `enabled = false` (or on
/// an error, which is recorded). The fields are checked either way, so that
/// turning the store on later cannot reveal an old mistake.
pub(super) fn idempotency(
    cx: &mut ErrorSink,
    name: &str,
    p: &RawPolicy,
) -> Option<IdempotencyParams> {
    let i = p.idempotency.clone().unwrap_or_default();
    IdempotencyParams::try_new(
        i.ttl.map(|d| d.0).unwrap_or_default(),
        i.max_bytes.unwrap_or_default(),
        i.max_response_bytes.unwrap_or_default(),
        i.methods.as_deref().unwrap_or_default(),
    )
    .and_then(|p| p.with_scope(i.scope.as_deref()))
    .map_err(|e| cx.policy_err(name, "idempotency", e))
    .ok()
    .filter(|_| i.enabled.unwrap_or(true))
}

/// The response cache's parameters; `None` when `enabled = false` (the
/// default) or on an error, which is recorded. `max_object_bytes` ≤
/// `max_bytes` is checked either way, so that turning the cache on later
/// cannot reveal an old mistake; `max_bytes` ≥ 1 only when it is on.
pub(super) fn cache(cx: &mut ErrorSink, name: &str, p: &RawPolicy) -> Option<CacheParams> {
    let c = p.cache.clone().unwrap_or_default();
    let enabled = c.enabled.unwrap_or(false);
    let dur = |d: Option<duration::Dur>| d.map(|d| d.0).unwrap_or_default();
    let params = CacheParams::try_new(
        c.max_bytes.unwrap_or_default(),
        c.max_object_bytes.unwrap_or_default(),
        dur(c.default_ttl),
        dur(c.stale_while_revalidate),
        dur(c.stale_if_error),
        c.store_set_cookie.unwrap_or(false),
    );
    match params {
        Ok(params) => enabled.then_some(params),
        Err(e) if !enabled && e.field == "max_bytes" => None,
        Err(e) => {
            cx.policy_err(name, "cache", e);
            None
        }
    }
}

/// Hedging's parameters; `None` without a `hedge` table, with
/// `enabled = false`, or on an error (recorded). Hedging needs retries: a
/// hedge is an extra attempt, replayed under the retry rules.
pub(super) fn hedge(
    cx: &mut ErrorSink,
    name: &str,
    p: &RawPolicy,
    retry: Option<&RetryPolicy>,
) -> Option<HedgeParams> {
    let h = p.hedge.clone()?;
    if !h.enabled.unwrap_or(true) {
        return None;
    }
    let after = h.after.clone().unwrap_or_default();
    let fixed = duration::parse(&after).ok();
    let params = HedgeParams::try_new(
        &after,
        fixed,
        h.max_extra.unwrap_or_default(),
        h.max_hedges.unwrap_or_default(),
        h.keyed_writes.unwrap_or(false),
    );
    let params = match params {
        Ok(params) => params,
        Err(e) => {
            cx.policy_errs(name, "hedge", e);
            return None;
        }
    };
    if retry.is_some_and(|r| r.max_attempts < 2) {
        let f = cx.policy_path(name, "hedge.enabled");
        cx.err(
            f,
            "hedging needs retries (retry.max_attempts of 2 or more): a hedge is an extra attempt",
        );
        return None;
    }
    Some(params)
}

/// `[….concurrency]`: `max_in_flight`, `max_queue`, and with `limit =
/// "adaptive"` the adaptive limit's parameters, `max_in_flight` its ceiling
/// (docs/reference/admission.md#adaptive-limit).
pub(super) fn concurrency(
    cx: &mut ErrorSink,
    name: &str,
    p: &RawPolicy,
) -> crate::config::ConcurrencyParams {
    let c = p.concurrency.clone().unwrap_or_default();
    let max_in_flight = c.max_in_flight.unwrap_or_default();
    if max_in_flight == 0 {
        let f = cx.policy_path(name, "concurrency.max_in_flight");
        cx.err(f, "must be at least 1");
    }
    let adaptive = match c.limit.as_deref().unwrap_or("fixed") {
        "fixed" => None,
        "adaptive" => {
            let dur = |d: Option<duration::Dur>| d.map(|d| d.0).unwrap_or_default();
            let made = crate::policy::AdaptiveParams::try_new(
                c.min_limit.unwrap_or_default(),
                max_in_flight.max(1),
                c.initial_limit.unwrap_or_default(),
                c.latency_tolerance.unwrap_or_default(),
                dur(c.window),
                dur(c.recheck),
            );
            match made {
                Ok(a) => Some(a),
                Err(mut e) => {
                    for one in &mut e.0 {
                        one.field = match one.field {
                            "min" => "min_limit",
                            "initial" => "initial_limit",
                            "tolerance" => "latency_tolerance",
                            other => other,
                        };
                    }
                    cx.policy_errs(name, "concurrency", e);
                    None
                }
            }
        }
        other => {
            let f = cx.policy_path(name, "concurrency.limit");
            let hint = crate::policy::suggest::hint(other, ["fixed", "adaptive"]);
            cx.err(
                f,
                format!("unknown limit {other:?}: {hint}expected \"fixed\" or \"adaptive\""),
            );
            None
        }
    };
    crate::config::ConcurrencyParams {
        max_in_flight,
        max_queue: c.max_queue.unwrap_or_default(),
        adaptive,
    }
}

/// `[….throttle]`: client-side throttling's parameters, `None` while
/// `enabled = false` (the default). The fields are checked either way, so
/// a mistake is found before the table is turned on.
pub(super) fn throttle(
    cx: &mut ErrorSink,
    name: &str,
    p: &RawPolicy,
) -> Option<crate::policy::ThrottleParams> {
    let t = p.throttle.clone().unwrap_or_default();
    let made = crate::policy::ThrottleParams::try_new(
        t.multiplier.unwrap_or_default(),
        t.window.map(|d| d.0).unwrap_or_default(),
        t.max_reject.unwrap_or_default(),
        t.min_requests.unwrap_or_default(),
    );
    match made {
        Ok(params) => t.enabled.unwrap_or(false).then_some(params),
        Err(e) => {
            cx.policy_errs(name, "throttle", e);
            None
        }
    }
}
