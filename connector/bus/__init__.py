"""The Bus surface (SPEC 10): operations on NATS, a client, and the `op.done` announcements."""
