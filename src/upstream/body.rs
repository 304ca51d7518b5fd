//! The one response body type of the general path's upstream side
//! ([`UpstreamBody`]), whichever client read the response.

use super::http1::H1Body;
use super::pool::h2::H2Body;
use super::send::BoxError;
use bytes::Bytes;
use http_body::{Body as HttpBody, Frame, SizeHint};
use std::pin::Pin;
use std::task::{Context, Poll};

/// An upstream's response body on the general path.
#[derive(Debug)]
pub(crate) enum UpstreamBody {
    /// hyper's HTTP/1.1 client (requests from HTTP/1.1 clients, upgrades).
    Hyper(hyper::body::Incoming),
    /// weir's own HTTP/1.1 client (`upstream::http1`); boxed, as it holds
    /// its connection and buffer, so that a response moves as a pointer.
    H1(Box<H1Body>),
    /// An HTTP/2 stream of weir's HTTP/2 pool (`upstream::pool::h2`).
    H2(H2Body),
}

impl From<hyper::body::Incoming> for UpstreamBody {
    fn from(b: hyper::body::Incoming) -> Self {
        UpstreamBody::Hyper(b)
    }
}

impl From<H1Body> for UpstreamBody {
    fn from(b: H1Body) -> Self {
        UpstreamBody::H1(Box::new(b))
    }
}

impl From<H2Body> for UpstreamBody {
    fn from(b: H2Body) -> Self {
        UpstreamBody::H2(b)
    }
}

impl HttpBody for UpstreamBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self.get_mut() {
            UpstreamBody::Hyper(b) => Pin::new(b).poll_frame(cx).map_err(Into::into),
            UpstreamBody::H1(b) => Pin::new(b.as_mut()).poll_frame(cx),
            UpstreamBody::H2(b) => Pin::new(b).poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            UpstreamBody::Hyper(b) => b.is_end_stream(),
            UpstreamBody::H1(b) => b.is_end_stream(),
            UpstreamBody::H2(b) => b.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            UpstreamBody::Hyper(b) => b.size_hint(),
            UpstreamBody::H1(b) => b.size_hint(),
            UpstreamBody::H2(b) => b.size_hint(),
        }
    }
}
