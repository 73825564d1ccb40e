"""The host's Prometheus counters: polls, terminal outcomes by status, expirations, errors, active work.

Labels are fixed vocabularies (statuses, outcome names); no operation id, owner or candidate data ever
becomes a label or a value.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge


class HostMetrics:
    """Counters registered in one `CollectorRegistry` (the assembled one serves them at `/metrics`)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self.polls = Counter(
            "sensorium_host_polls", "Connector status polls made by the host", registry=self.registry
        )
        self.terminal = Counter(
            "sensorium_host_terminal_outcomes",
            "Operations that reached a terminal status, by status",
            ["status"],
            registry=self.registry,
        )
        self.expirations = Counter(
            "sensorium_host_expirations", "Operations the host ended as expired", registry=self.registry
        )
        self.errors = Counter(
            "sensorium_host_poll_errors", "Polls that failed inside the host", registry=self.registry
        )
        self.continuations = Counter(
            "sensorium_host_continuations",
            "Continuations handed to their flow, by outcome (resumed, failed)",
            ["outcome"],
            registry=self.registry,
        )
        self.active = Gauge(
            "sensorium_host_operations_active",
            "Host-registered operations that are not terminal yet",
            registry=self.registry,
        )

    def count(self, name: str, *, label: str | None = None) -> float:
        """The current value of one counter (tests and benchmarks)."""
        suffix = "_total" if name != "sensorium_host_operations_active" else ""
        labels = None
        if label is not None:
            labels = {"status": label} if name == "sensorium_host_terminal_outcomes" else {"outcome": label}
        value = self.registry.get_sample_value(name + suffix, labels)
        return 0.0 if value is None else value
