-- A 1 KiB POST without an idempotency key (compare post1k-keyed.lua).
wrk.method = "POST"
wrk.body = string.rep("x", 1024)
wrk.headers["Content-Type"] = "application/octet-stream"
