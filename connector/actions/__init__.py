"""Local programs behind command actions."""
