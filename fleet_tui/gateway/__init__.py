"""The local gateway: one detached process between the workers and the providers.

Every worker talks to `http://127.0.0.1:PORT/e/<endpoint>/...` with a token minted for its
attempt; the gateway alone holds the real keys, passes requests and streamed answers
through unchanged, keeps at most `max_requests` in flight per endpoint (the rest wait,
fair across tasks), answers by itself while the endpoint is parked or held, and meters
every request into the store. `routes` says which endpoints there are, `slots` is the
waiting line, `server` the process, `control` how the engine finds or starts it."""
