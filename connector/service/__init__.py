"""The application service shared by the HTTP and Bus faces."""
