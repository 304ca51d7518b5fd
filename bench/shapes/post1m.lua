-- A 1 MiB POST with its Content-Length: larger than max_replay_body_bytes,
-- so weir streams it (hyper's path) and must keep its length on the way.
wrk.method = "POST"
wrk.path = "/post"
wrk.body = string.rep("x", 1048576)
wrk.headers["Content-Type"] = "application/octet-stream"
