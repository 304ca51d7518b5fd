#!/usr/bin/env node
// Node's own `http` module serving the app of tests/servers/interop_app.py
// (the same routes and JSON record), for tests/interop_matrix.rs:
//
//     node interop_node.js
//
// Binds 127.0.0.1:0 and prints `PORT <n>`. The body is read from the
// request stream to its end, however it was framed (Node decodes chunked).
'use strict';

const http = require('http');
const crypto = require('crypto');

const seen = new Map();

function download(n) {
  const b = Buffer.allocUnsafe(n);
  for (let i = 0; i < n; i++) b[i] = i % 251;
  return b;
}

function plan(req, body) {
  const url = new URL(req.url, 'http://x');
  const path = url.pathname;
  const h = (name) => (req.headers[name] === undefined ? null : req.headers[name]);
  const record = {
    server: 'node',
    method: req.method,
    path,
    content_length: h('content-length'),
    transfer_encoding: h('transfer-encoding'),
    expect: h('expect'),
    idempotency_key: h('idempotency-key'),
    body_len: body.length,
    sha256: crypto.createHash('sha256').update(body).digest('hex'),
    seen: 1,
  };
  const json = (status, delay = 0) => [status, { 'content-type': 'application/json' }, Buffer.from(JSON.stringify(record)), delay];
  const count = (key) => {
    const n = (seen.get(key) || 0) + 1;
    seen.set(key, n);
    return n;
  };
  if (path.startsWith('/download/')) {
    return [200, { 'content-type': 'application/octet-stream' }, download(Number(url.searchParams.get('n') || 0)), 0];
  }
  if (path.startsWith('/status/204/')) return [204, {}, Buffer.alloc(0), 0];
  if (path.startsWith('/status/304/')) {
    if (h('if-none-match') === '"v1"') return [304, { etag: '"v1"' }, Buffer.alloc(0), 0];
    return [200, { etag: '"v1"', 'content-type': 'text/plain' }, Buffer.from('fresh'), 0];
  }
  if (path.startsWith('/flaky/')) {
    record.seen = count('flaky ' + path);
    return json(record.seen === 1 ? 503 : 200);
  }
  if (path.startsWith('/slow/')) {
    record.seen = count('slow ' + path);
    return json(200, record.seen === 1 ? Number(url.searchParams.get('ms') || 0) : 0);
  }
  if (path.startsWith('/check/')) {
    const ok = record.content_length === url.searchParams.get('len')
      && record.transfer_encoding === null
      && record.sha256 === url.searchParams.get('sha');
    return json(ok ? 200 : 422);
  }
  if (path.startsWith('/echo/')) return json(200);
  return [404, { 'content-type': 'text/plain' }, Buffer.from('no such route\n'), 0];
}

const server = http.createServer((req, res) => {
  const chunks = [];
  req.on('data', (c) => chunks.push(c));
  req.on('end', () => {
    const [status, headers, out, delay] = plan(req, Buffer.concat(chunks));
    if (status !== 204 && status !== 304) headers['content-length'] = String(out.length);
    setTimeout(() => {
      res.writeHead(status, headers);
      res.end(req.method === 'HEAD' ? undefined : out);
    }, delay);
  });
});
server.keepAliveTimeout = 60000;
server.listen(0, '127.0.0.1', () => {
  process.stdout.write(`PORT ${server.address().port}\n`);
});
