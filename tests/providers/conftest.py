"""Provider tests. Each transport keeps its peers and fixtures in its own helper module (`bluez_mock`,
`mdns_peer`, ...), imported by the test files that need it, so one transport's tests never load another's
libraries or emulators."""
