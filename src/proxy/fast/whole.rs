//! A response read whole on the fast path before any of it is relayed, so
//! that the response cache can store it (docs/reference/cache.md#response-cache;
//! when, and what is stored, are the order's cache step's:
//! `proxy::order::cache`): a body that breaks off is weir's error, and
//! nothing of it has reached the client.

use super::head::{ChunkedRelay, Framing};
use super::io::read_more;
use super::transport::H1Answer;
use super::Ctx;
use crate::h1;
use crate::proxy::error::ProxyError;
use crate::proxy::Upstream;
use tokio::time::Instant;

impl Ctx<'_> {
    /// Reads the rest of `x`'s body into the upstream buffer after what
    /// came with its head, each wait bounded by `idle_timeout`. `Ok(Some)`:
    /// the body's data, whole; `Ok(None)`: it is larger than `limit` or has
    /// trailers (relayed as it comes, not stored); `Err`: it broke off.
    pub(super) async fn read_whole(
        &mut self,
        up: &Upstream,
        x: &mut H1Answer,
        limit: usize,
    ) -> Result<Option<Vec<u8>>, ProxyError> {
        if matches!(x.framing, Framing::Length(n) if n > limit as u64) {
            return Ok(None);
        }
        // A chunked body's coding, bounded too.
        let most = limit.saturating_mul(2).saturating_add(4096);
        let mut chunked = ChunkedRelay::default();
        let mut scratch = Vec::new();
        let mut fed = 0;
        let mut closed = false;
        loop {
            let tail = self.bufs.upstream.get(x.head_len..).unwrap_or_default();
            let end = match x.framing {
                Framing::Empty => Some(0),
                Framing::Length(n) => usize::try_from(n).ok().filter(|n| tail.len() >= *n),
                Framing::Close => closed.then_some(tail.len()),
                Framing::Chunked => {
                    scratch.clear();
                    match chunked.feed(&tail[fed..], &mut scratch) {
                        Ok(Some(n)) => Some(fed + n),
                        Ok(None) => {
                            fed = tail.len();
                            None
                        }
                        Err(why) => return Err(ProxyError::UpstreamReset(why.into())),
                    }
                }
            };
            if let Some(end) = end {
                let body = &tail[..end];
                return Ok(match x.framing {
                    Framing::Chunked => {
                        let (data, trailers) = h1::chunk_data(body);
                        (!trailers && data.len() <= limit).then_some(data)
                    }
                    _ => (body.len() <= limit).then(|| body.to_vec()),
                });
            }
            if tail.len() > most || (x.framing == Framing::Close && tail.len() > limit) {
                return Ok(None);
            }
            let had = tail.len();
            let until = Instant::now() + up.config.idle_timeout;
            tokio::select! {
                biased;
                r = read_more(&mut x.upstream, &mut self.bufs.upstream) => match r {
                    Ok(0) if x.framing == Framing::Close => closed = true,
                    Ok(0) | Err(_) => return Err(broke_off(had)),
                    Ok(_) => {}
                },
                () = self.timer.at(until) => return Err(broke_off(had)),
            }
        }
    }
}

/// weir's error for a body that ended before it was whole, as the general path
/// says it.
fn broke_off(had: usize) -> ProxyError {
    ProxyError::UpstreamReset(format!("the response body broke off after {had} bytes"))
}
