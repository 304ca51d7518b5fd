-- A chunked request body (16 KiB in one chunk) and, through gzip at the
-- upstream, a chunked response. The request is written out whole: wrk would
-- add a Content-Length to a body given as wrk.body.
local req
function init(args)
    req = "POST /chunked HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n" ..
        "Accept-Encoding: gzip\r\nContent-Type: application/octet-stream\r\n\r\n" ..
        "4000\r\n" .. string.rep("x", 16384) .. "\r\n0\r\n\r\n"
end
function request()
    return req
end
