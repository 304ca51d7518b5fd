#!/usr/bin/env node
// Node's built-in fetch (undici) as a client for tests/interop_matrix.rs:
//
//     node interop_fetch.js SPEC.json
//
// SPEC and the JSON array printed are those of tests/servers/interop_client.py
// (no primer). A chunked request sends its body as a stream (`duplex:
// 'half'`), which fetch sends without a length.
'use strict';

const fs = require('fs');
const crypto = require('crypto');

function bodyOf(spec) {
  if (!spec.body_file) return undefined;
  const data = fs.readFileSync(spec.body_file);
  if (!spec.chunked) return data;
  const step = Math.max(1, Math.floor(data.length / 3));
  let at = 0;
  return new ReadableStream({
    pull(controller) {
      if (at >= data.length) {
        controller.close();
        return;
      }
      controller.enqueue(new Uint8Array(data.subarray(at, at + step)));
      at += step;
    },
  });
}

async function one(spec) {
  const started = Date.now();
  const out = {
    id: spec.id, status: 0, http_version: 'HTTP/1.1', headers: [], body_len: 0,
    sha256: crypto.createHash('sha256').update(Buffer.alloc(0)).digest('hex'),
    json: null, error: null, ms: 0,
  };
  try {
    const init = {
      method: spec.method, headers: spec.headers || [], redirect: 'manual', signal: AbortSignal.timeout(30000),
    };
    const body = bodyOf(spec);
    if (body !== undefined) {
      init.body = body;
      if (spec.chunked) init.duplex = 'half';
    }
    const r = await fetch(spec.url, init);
    const buf = Buffer.from(await r.arrayBuffer());
    out.status = r.status;
    out.headers = [...r.headers.entries()];
    out.body_len = buf.length;
    out.sha256 = crypto.createHash('sha256').update(buf).digest('hex');
    if (buf[0] === 0x7b) {
      try { out.json = JSON.parse(buf.toString()); } catch (e) { /* not JSON */ }
    }
  } catch (e) {
    out.error = `${e.name}: ${e.message}${e.cause ? ` (${e.cause.message || e.cause})` : ''}`;
  }
  out.ms = Date.now() - started;
  return out;
}

(async () => {
  const specs = JSON.parse(fs.readFileSync(process.argv[2]));
  const results = [];
  for (const spec of specs) results.push(await one(spec));
  process.stdout.write(JSON.stringify(results) + '\n');
})();
