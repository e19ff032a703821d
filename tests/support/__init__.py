"""Helpers every test folder shares (issue 22): a test imports helpers from here, never from a conftest.py or
another test module, and a folder's conftest.py takes shared fixtures from here. `waiting.eventually` waits
for a condition, never for a time; `stack`, `web_stack` and `threaded_stack` are the stack builders (by how
the test drives them); `engine_hosts` runs engine hosts as processes or in this process; `ownership` says who
holds a session; the rest are one folder's concern that others reuse (fence, admission, recovery, voice,
chaos, moves, metrics, fleet)."""
