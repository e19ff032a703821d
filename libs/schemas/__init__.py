"""Versioned bus messages (msgspec Structs, msgpack on the wire).

Schema-evolution rules (msgspec's): a new field gets a default; a field's type
never changes; a message that changes incompatibly gets a new `v` and the
reader says which versions it supports.
"""
