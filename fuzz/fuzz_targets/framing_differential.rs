//! weir's request framing against a strict reference written from RFC 9112
//! (`tests/reference/rfc9112.rs`), over arbitrary bytes: the guard in front
//! of hyper and the fast path agree with the reference on where each
//! request starts and ends, or weir refuses.
#![no_main]

use libfuzzer_sys::fuzz_target;
use weir::cli::fuzzing::guard_frame;
use weir::proxy::fast::head::{plan, Parse};
use weir_fuzz::reference::{agree, frame, RefMark};
use weir_fuzz::{reads, role, snapshot, MAX_HEAD};

fuzz_target!(|data: &[u8]| {
    let (pieces, bytes) = reads(data);
    let reference = frame(bytes);
    if let Err(e) = agree(&guard_frame(bytes, &pieces, MAX_HEAD), &reference) {
        panic!(
            "the guard: {e}\n  bytes: {:?}",
            String::from_utf8_lossy(bytes)
        );
    }
    // The fast path reads one request at a time from the start of its
    // buffer: one it takes ends where the reference's first request ends.
    let mut out = Vec::new();
    if let Parse::Done(p) = plan(snapshot(), &role(), bytes, &mut out) {
        let end = p.head_len + p.body_len;
        let head_ok =
            matches!(reference.first(), Some(RefMark::Head { end, .. }) if *end == p.head_len);
        let body_ok = match reference.get(1) {
            Some(RefMark::End(e)) => *e == end,
            None => end > bytes.len(),
            Some(_) => false,
        };
        assert!(
            head_ok && body_ok,
            "the fast path ends the first request at {} + {}, the reference: {reference:?}\n  bytes: {:?}",
            p.head_len,
            p.body_len,
            String::from_utf8_lossy(bytes)
        );
    }
});
