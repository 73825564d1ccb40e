"""The signed action catalog: operator keys, signing and verification (pure), rollback state and loading."""
