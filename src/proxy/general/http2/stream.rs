//! One HTTP/2 stream of a client connection: its request served by the
//! general path, raced against the client resetting the stream, and its
//! response sent back: the head as hyper's server wrote it (connection
//! fields dropped, `Date` added, `Content-Length` from a body of known
//! length), the body under the client's flow control
//! (`crate::h2stream::Pump`), trailers last.

use super::super::activity::{Busy, Holding};
use super::super::ServeState;
use crate::proxy::body::{Body, ClientBody};
use crate::proxy::ListenerRole;
use bytes::Bytes;
use http::header::{CONTENT_LENGTH, DATE};
use http::{HeaderValue, Request, Response};
use http_body::Body as _;
use std::net::SocketAddr;
use std::sync::Arc;

/// What every stream of one connection shares.
pub(super) struct StreamCtx {
    pub(super) peer: SocketAddr,
    pub(super) role: ListenerRole,
    pub(super) shared: Arc<ServeState>,
    /// The upstream connections this client connection holds.
    pub(super) ctx: Arc<crate::upstream::pool::held::ConnCtx>,
}

/// Serves one stream. `busy` counts it in flight (and, dropped before its
/// response went out whole, as abandoned) until its response body is done.
pub(super) async fn serve(
    on: Arc<StreamCtx>,
    req: Request<h2::RecvStream>,
    mut respond: h2::server::SendResponse<Bytes>,
    busy: Busy,
) {
    let (mut parts, recv) = req.into_parts();
    let length = parts
        .headers
        .get(CONTENT_LENGTH)
        .and_then(|v| crate::h1::content_length(v.as_bytes()));
    let body = ClientBody::H2(crate::h2stream::H2Body::new(recv, length));
    parts
        .extensions
        .insert(crate::proxy::access::ClientAddr(on.peer));
    let req = Request::from_parts(parts, body);
    let snap = on.shared.snapshot.load_full();
    let handled = crate::proxy::general::handle(&snap, &on.role, &on.ctx, req, None);
    // A client that resets the stream abandons the request: its future is
    // dropped (and with it every attempt, as when an HTTP/1.1 client
    // leaves).
    let resp = tokio::select! {
        biased;
        resp = handled => resp,
        _ = std::future::poll_fn(|cx| respond.poll_reset(cx)) => return,
    };
    // The head is handed over now; until the client's window lets the
    // body move, it waits on the client.
    busy.handed_now();
    let (mut head, body) = resp.into_parts();
    let body = Holding::new(body, busy);
    respond_head(&mut head, &body);
    let end = body.is_end_stream();
    let Ok(send) = respond.send_response(Response::from_parts(head, ()), end) else {
        // The stream is gone (reset, or the connection closing).
        return;
    };
    if !end {
        crate::h2stream::Pump::new(send, body, h2::Reason::INTERNAL_ERROR).await;
    }
}

/// The response head as it goes out on HTTP/2, written as hyper's server
/// wrote it: what HTTP/2 forbids dropped, a `Date` when the response has
/// none (weir's own answers), and a body of known length announced in
/// `Content-Length`.
fn respond_head(head: &mut http::response::Parts, body: &Holding<Body>) {
    crate::h2stream::strip_connection_fields(&mut head.headers, false);
    if !head.headers.contains_key(DATE) {
        let now = httpdate::fmt_http_date(crate::clock::Clock::new().wall());
        if let Ok(v) = HeaderValue::from_str(&now) {
            head.headers.insert(DATE, v);
        }
    }
    if !body.is_end_stream() && !head.headers.contains_key(CONTENT_LENGTH) {
        if let Some(n) = body.size_hint().exact() {
            head.headers.insert(CONTENT_LENGTH, HeaderValue::from(n));
        }
    }
}
