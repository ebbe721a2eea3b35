"""The lanes' replicas: the HTTP/1.1 client and its pool, upstream errors, encodings, health and probes."""
