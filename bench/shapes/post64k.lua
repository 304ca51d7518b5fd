-- A 64 KiB POST (held for a replay by weir: under max_replay_body_bytes).
wrk.method = "POST"
wrk.path = "/post"
wrk.body = string.rep("x", 65536)
wrk.headers["Content-Type"] = "application/octet-stream"
