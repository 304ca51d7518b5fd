-- A 1 KiB POST with a new Idempotency-Key on each: every one is fingerprinted,
-- recorded in flight, and its response kept (the store evicts the oldest
-- records once it holds max_bytes, as in a long run).
local body = string.rep("x", 1024)
local n = 0
local prefix
function init(args)
    prefix = tostring(math.random(1, 1000000000)) .. "-"
end
function request()
    n = n + 1
    return wrk.format("POST", nil, {
        ["Content-Type"] = "application/octet-stream",
        ["Idempotency-Key"] = prefix .. n,
    }, body)
end
