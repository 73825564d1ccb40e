"""The federated operator view of a lab (CONTRACT §15): an edge over NATS and HTTP around `core.lab`."""
