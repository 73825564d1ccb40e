"""The Bus surface (CONTRACT §10): operations on NATS, a client, and the `op.done` announcements."""
