//! Entry points for the fuzz targets in `fuzz/` and for the tests that
//! replay their corpus: the parts of weir that read bytes from outside,
//! reachable without a running proxy. Not a stable API.

pub use crate::proxy::general::guard::{Mark, Refusal, Stop};

/// The request-smuggling guard's view of a client connection's bytes, read
/// in pieces of the given sizes (the rest in one read): each head it
/// accepts, each request's end, and where it stops following and why.
/// `max_head` is `[server] max_header_bytes`.
pub fn guard_frame(bytes: &[u8], pieces: &[usize], max_head: usize) -> Vec<Mark> {
    crate::proxy::general::guard::frame(bytes, pieces, max_head)
}

pub use crate::proxy::general::guard::FramingGuard;

/// A client connection wrapped in the request-smuggling guard, as weir
/// wraps every HTTP/1 connection before hyper reads it (for tests that put
/// hyper behind it).
pub fn guard<T>(io: T, max_head: usize) -> FramingGuard<T> {
    FramingGuard::new(io, max_head, std::time::Duration::from_secs(10))
}
