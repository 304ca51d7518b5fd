//! Micro-benchmarks of the policy core: all of one request's policy work
//! should stay well under 1 µs.
#![allow(clippy::unwrap_used)]

use criterion::{criterion_group, criterion_main, Criterion};
use std::hint::black_box;
use std::time::Duration;
use weir::policy::{
    decide, BackoffPolicy, BodyFacts, Breaker, BreakerParams, BudgetParams, DecideInput,
    FixedGates, Growth, Jitter, KeyedLimiter, Outcome, RateLimitParams, RequestFacts, RetryBudget,
    RetryOn, RetryPolicy, SeededRandom, TokenBucket,
};

fn policy() -> RetryPolicy {
    let retry_on = RetryOn::parse(
        &["connect-failure", "reset", "timeout", "502", "503", "504"].map(String::from),
    )
    .unwrap();
    let backoff = BackoffPolicy::try_new(
        Duration::from_millis(200),
        Duration::from_secs(10),
        2.0,
        Growth::Exponential,
        Jitter::Full,
        false,
    )
    .unwrap();
    let budget = BudgetParams::try_new(0.1, 10, Duration::from_secs(10), 2).unwrap();
    RetryPolicy::try_new(
        3,
        retry_on,
        Duration::from_secs(60),
        65_536,
        Duration::from_millis(10),
        backoff,
        budget,
    )
    .unwrap()
}

fn benches(c: &mut Criterion) {
    let p = policy();
    let facts = RequestFacts::new("GET", false, BodyFacts::Buffered { len: 512 });
    let outcome = Outcome::Response {
        status: 503,
        retry_after: None,
        grpc_status: None,
        pushback: None,
    };
    let mut rng = SeededRandom::new(7);
    c.bench_function("decide", |b| {
        b.iter(|| {
            let input = DecideInput {
                policy: &p,
                facts: &facts,
                outcome: black_box(&outcome),
                attempts_made: 1,
                time_left: Some(Duration::from_secs(14)),
                prev_delay: Duration::ZERO,
                elsewhere: false,
            };
            let mut gates = FixedGates {
                budget: true,
                breaker: true,
                limiter: true,
            };
            decide(&input, &mut rng, &mut gates)
        })
    });

    let bp = BreakerParams::try_new(
        true,
        5,
        20,
        5,
        0.5,
        vec![500, 502, 503, 504],
        Duration::from_secs(30),
        Duration::from_secs(300),
        0.2,
        1,
    )
    .unwrap();
    let mut breaker = Breaker::new(bp);
    let mut now = Duration::from_secs(1);
    let mut i = 0u64;
    c.bench_function("breaker acquire+record", |b| {
        b.iter(|| {
            now += Duration::from_micros(100);
            i += 1;
            if let Ok(a) = breaker.try_acquire(now) {
                // one failure in eight: stays closed, exercises the window
                let _ = breaker.record(a, i % 8 == 0, now, &mut rng);
            }
        })
    });

    let mut budget = RetryBudget::new(
        BudgetParams::try_new(0.1, 10, Duration::from_secs(10), 2).unwrap(),
        Duration::ZERO,
    );
    let mut now = Duration::ZERO;
    c.bench_function("budget deposit+withdraw", |b| {
        b.iter(|| {
            now += Duration::from_micros(100);
            budget.deposit(now);
            black_box(budget.try_withdraw(1, now))
        })
    });

    let mut bucket = TokenBucket::new(1e6, 100, Duration::ZERO);
    let mut now = Duration::ZERO;
    c.bench_function("bucket take", |b| {
        b.iter(|| {
            now += Duration::from_micros(1);
            black_box(bucket.try_take(1, now))
        })
    });

    let rl = RateLimitParams::try_new(
        Some((1e6, 100)),
        Some((1_000_000, Duration::from_secs(60))),
        Some("header:x-tenant"),
        10_000,
        Duration::ZERO,
    )
    .unwrap();
    let mut keyed = KeyedLimiter::new(rl, Duration::ZERO);
    let keys: Vec<String> = (0..20_000).map(|k| format!("tenant-{k}")).collect();
    let mut now = Duration::ZERO;
    let mut k = 0usize;
    c.bench_function("keyed limiter acquire (20k keys, 10k max)", |b| {
        b.iter(|| {
            now += Duration::from_micros(1);
            k = (k + 7_919) % keys.len();
            black_box(keyed.try_acquire(Some(&keys[k]), now))
        })
    });
}

/// A keyed write's work (docs/reference/idempotency.md#idempotency-keys), as the fast
/// path does it for a 1 KiB POST with a new key, against a store that is
/// full (every new record evicts the oldest): the fingerprint alone; the
/// store's begin and finish alone; and the whole of it — the fingerprint,
/// the begin, the kept response made as the data plane makes it (the field
/// block copied whole, the body appended, one buffer sized for both) and
/// the finish by ticket. Keys are written into one reused buffer, so the
/// figures hold no allocation the data plane does not make.
fn idempotency(c: &mut Criterion) {
    use std::fmt::Write as _;
    use weir::policy::idempotency::{
        Fingerprint, FingerprintHasher, IdempotencyParams, IdempotencyStore, MemoryStore, Record,
        StoredResponse,
    };
    let body = vec![b'x'; 1024];
    c.bench_function("fingerprint (SHA-256, 1 KiB body)", |b| {
        b.iter(|| black_box(Fingerprint::new("POST", "/orders", black_box(&body))))
    });
    let full_store = || {
        let params = IdempotencyParams::try_new(
            Duration::from_secs(86_400),
            16 << 20,
            1 << 20,
            &["POST".to_string()],
        )
        .unwrap();
        MemoryStore::new(params)
    };
    // nginx's fields for a small JSON answer, as a client gets them.
    let fields: &[u8] = b"server: nginx/1.22.1\r\ndate: Tue, 01 Dec 2026 10:00:00 GMT\r\n\
        content-type: application/json\r\n";
    let answer = [b'o'; 64];
    let fp = Fingerprint::new("POST", "/orders", &body);
    let mut key = String::new();
    let mut n = 0u64;
    let mut now = Duration::ZERO;
    // One keyed write: `hash` says whether to fingerprint its body too.
    let mut step = |store: &mut MemoryStore, hash: bool| {
        n += 1;
        now += Duration::from_micros(1);
        key.clear();
        let _ = write!(key, "{n:x}-3f2a-4c1e-9b7d-0c5e8a61d2f4");
        let fp = match hash {
            true => {
                let mut h = FingerprintHasher::new(b"POST", b"/orders");
                h.update(black_box(&body));
                h.finish()
            }
            false => fp,
        };
        let (begun, ticket) = store.begin_ticket(&key, &fp, now);
        black_box(begun);
        let mut kept = Vec::with_capacity(fields.len() + answer.len());
        kept.extend_from_slice(fields);
        kept.extend_from_slice(black_box(&answer));
        let r = StoredResponse::from_buffer(201, kept, fields.len());
        if let Some(t) = ticket {
            store.finish_ticket(t, Record::Completed, Some(r), now);
        }
    };
    let mut store = full_store();
    while store.stats().evicted == 0 {
        step(&mut store, false);
    }
    c.bench_function("idempotency store begin+complete (full, evicting)", |b| {
        b.iter(|| step(&mut store, false))
    });
    c.bench_function(
        "keyed write, all of it (fingerprint, begin, kept response, finish)",
        |b| b.iter(|| step(&mut store, true)),
    );
}

criterion_group!(policy_benches, benches, idempotency);
criterion_main!(policy_benches);
