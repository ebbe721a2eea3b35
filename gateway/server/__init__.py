"""The HTTP server: the raw HTTP/1.1 wire path, the client link, CORS, access rules, keys and headers."""
