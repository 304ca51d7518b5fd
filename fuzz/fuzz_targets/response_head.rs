//! An upstream's bytes through the fast path's response reader: the head
//! parser and the chunked relay never panic; a head it passes on is one a
//! parser reads whole, with one framing; the relay ends a body at the same
//! byte however the body arrives.
#![no_main]

use libfuzzer_sys::fuzz_target;
use weir::proxy::fast::head::{finish_response, parse_response, ChunkedRelay, Framing, Head};
use weir_fuzz::reads;

fuzz_target!(|data: &[u8]| {
    let (pieces, bytes) = reads(data);
    let is_head_request = pieces.first().is_some_and(|p| p % 2 == 1);
    let mut out = Vec::new();
    let now = || std::time::UNIX_EPOCH;
    if let Ok(Some(Head::Final(r))) = parse_response(bytes, is_head_request, now, &mut out) {
        assert!(r.head_len <= bytes.len());
        finish_response(&mut out, None, false);
        let mut fields = [httparse::EMPTY_HEADER; 256];
        let mut resp = httparse::Response::new(&mut fields);
        let parsed = resp.parse(&out);
        assert!(
            matches!(parsed, Ok(httparse::Status::Complete(n)) if n == out.len()),
            "the client's head does not parse: {:?}",
            String::from_utf8_lossy(&out)
        );
        let count = |name: &str| {
            resp.headers
                .iter()
                .filter(|h| h.name.eq_ignore_ascii_case(name))
                .count()
        };
        let (cl, te) = (count("content-length"), count("transfer-encoding"));
        assert!(
            cl <= 1 && te <= 1 && cl + te <= 1,
            "framed twice: {:?}",
            String::from_utf8_lossy(&out)
        );
        if let Framing::Length(n) = r.framing {
            let v = resp
                .headers
                .iter()
                .find(|h| h.name.eq_ignore_ascii_case("content-length"));
            assert_eq!(v.map(|h| h.value), Some(n.to_string().as_bytes()));
        }
    }

    // A chunked body, whole and in the given reads.
    let body = bytes;
    let mut whole_out = Vec::new();
    let whole = ChunkedRelay::default().feed(body, &mut whole_out);
    let mut relay = ChunkedRelay::default();
    let mut split_out = Vec::new();
    let mut at = 0;
    let mut split = Ok(None);
    for n in pieces.iter().copied().chain(std::iter::once(body.len())) {
        let end = (at + n).min(body.len());
        match relay.feed(&body[at..end], &mut split_out) {
            Ok(Some(k)) => {
                split = Ok(Some(at + k));
                break;
            }
            Ok(None) => at = end,
            Err(e) => {
                split = Err(e);
                break;
            }
        }
        if at == body.len() {
            break;
        }
    }
    assert_eq!(whole.is_err(), split.is_err(), "{whole:?} {split:?}");
    if let (Ok(Some(a)), Ok(Some(b))) = (whole, split) {
        assert_eq!(a, b, "the body ends at another byte when split");
        assert_eq!(
            whole_out, split_out,
            "the client gets other bytes when split"
        );
    }
});
