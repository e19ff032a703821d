"""Shared code for all statefleet services. Never imports `services`."""
