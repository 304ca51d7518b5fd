//! A client's bytes through weir's two HTTP/1 readers: the request-smuggling
//! guard (in any pieces) and the fast path's head parser. Neither panics;
//! the guard decides the same however the bytes arrive; a head the fast path
//! takes is rewritten into one a parser reads whole.
#![no_main]

use libfuzzer_sys::fuzz_target;
use weir::cli::fuzzing::{guard_frame, Mark, Stop};
use weir::proxy::fast::head::{plan, Parse};
use weir::h1::Chunked;
use weir_fuzz::{reads, role, snapshot, MAX_HEAD};

fn same(marks: Vec<Mark>) -> Vec<Mark> {
    marks
        .into_iter()
        .map(|m| match m {
            // Where in a bad chunked body it was noticed depends on the reads.
            Mark::Stop(_, Stop::BadChunked) => Mark::Stop(0, Stop::BadChunked),
            m => m,
        })
        .collect()
}

fuzz_target!(|data: &[u8]| {
    let (pieces, bytes) = reads(data);
    assert_eq!(
        same(guard_frame(bytes, &pieces, MAX_HEAD)),
        same(guard_frame(bytes, &[], MAX_HEAD)),
        "the guard's view depends on how the bytes arrive"
    );

    // The chunked coding alone, whole and byte by byte.
    let whole = Chunked::whole().feed(bytes);
    let mut c = Chunked::whole();
    let mut split = Ok(None);
    for (i, b) in bytes.iter().enumerate() {
        match c.feed(std::slice::from_ref(b)) {
            Ok(None) => {}
            Ok(Some(n)) => {
                split = Ok(Some(i + n));
                break;
            }
            Err(e) => {
                split = Err(e);
                break;
            }
        }
    }
    assert_eq!(whole, split, "the chunked coding depends on the reads");

    let mut out = Vec::new();
    if let Parse::Done(p) = plan(snapshot(), &role(), bytes, &mut out) {
        assert!(p.head_len <= bytes.len());
        let mut fields = [httparse::EMPTY_HEADER; 128];
        let parsed = httparse::Request::new(&mut fields).parse(&out);
        // The head; after it, a chunked body as plan() coded it anew.
        let head = match parsed {
            Ok(httparse::Status::Complete(n)) => n,
            _ => panic!(
                "the upstream's head does not parse: {:?}",
                String::from_utf8_lossy(&out)
            ),
        };
        let body = &out[head..];
        if p.chunked {
            let mut c = weir::h1::Chunked::whole();
            assert_eq!(
                c.feed(body),
                Ok(Some(body.len())),
                "the re-coded body is not one whole chunked body: {:?}",
                String::from_utf8_lossy(body)
            );
        } else {
            assert!(body.is_empty(), "bytes after the head: {body:?}");
        }
    }
});
