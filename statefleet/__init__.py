"""The `statefleet` command: the composition root that knows every service by name."""
