"""Helpers every test folder shares (issue 22): `waiting.eventually` (wait for a condition, never for a
time) and `stack` (the in-process stack: fence, placement, the mover, engine-host processes)."""
