-- A chunked request body (16 KiB in one chunk) and, through gzip at the
-- upstream, a chunked response.
wrk.method = "POST"
wrk.path = "/chunked"
wrk.headers["Transfer-Encoding"] = "chunked"
wrk.headers["Accept-Encoding"] = "gzip"
wrk.body = "4000\r\n" .. string.rep("x", 16384) .. "\r\n0\r\n\r\n"
