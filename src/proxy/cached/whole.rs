//! A response body read whole before any of it is relayed, so that it can
//! be stored (docs/reference/cache.md#response-cache): what a codec that
//! relays hyper's bodies keeps of it, to send first.

use crate::proxy::body::{self, Body};
use crate::proxy::error::ProxyError;
use crate::proxy::replay::Prefixed;
use bytes::Bytes;
use http_body::Frame;
use http_body_util::BodyExt;

/// What was read of a body before it is relayed: its data, then its
/// trailers when they came.
#[derive(Default)]
pub(crate) struct ReadBefore {
    pub data: Vec<Bytes>,
    pub trailers: Option<Frame<Bytes>>,
}

impl ReadBefore {
    /// The body as the client gets it: what was read, then `rest`.
    pub(crate) fn before(self, rest: Body) -> Body {
        body::boxed(Prefixed::new(self.data, self.trailers, rest))
    }
}

/// Reads `b` until it ends, or until more than `limit` bytes or trailers
/// came, each wait for a frame bounded by `idle` (the upstream's
/// `idle_timeout`, as when the body is relayed). `Ok(true)`: it ended, and
/// `ahead` holds all of it; `Ok(false)`: it goes on (relayed as it comes,
/// after `ahead`); `Err`: it broke off, or stalled.
pub(crate) async fn read<B>(
    b: &mut B,
    limit: usize,
    idle: std::time::Duration,
    ahead: &mut ReadBefore,
) -> Result<bool, ProxyError>
where
    B: http_body::Body<Data = Bytes> + Unpin,
    B::Error: std::fmt::Display,
{
    let mut size = 0usize;
    loop {
        let Ok(frame) = tokio::time::timeout(idle, b.frame()).await else {
            let why = format!("the response body broke off after {size} bytes: idle");
            return Err(ProxyError::UpstreamReset(why));
        };
        match frame {
            None => return Ok(true),
            Some(Ok(f)) => match f.into_data() {
                Ok(d) => {
                    size += d.len();
                    ahead.data.push(d);
                    if size > limit {
                        return Ok(false);
                    }
                }
                // Trailers: relayed, never stored.
                Err(f) => {
                    ahead.trailers = Some(f);
                    return Ok(false);
                }
            },
            Some(Err(e)) => {
                let why = format!("the response body broke off after {size} bytes: {e}");
                return Err(ProxyError::UpstreamReset(why));
            }
        }
    }
}
