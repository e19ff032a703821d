"""Fenced session ownership: the pure decision core, the log, `assign`, and the engine-side client."""
