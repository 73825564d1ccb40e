"""Provider tests and their transport peers (emulated BlueZ, mDNS responders, serial namespaces)."""
