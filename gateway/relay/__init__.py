"""The answer on its way out: forwarding, stream events, chunk shapes and runs, reshaping, shape checks, scrubbing."""
