"""Session checkpoints outside the GPU: one interface, NATS Object Store for small states and a
filesystem path for multi-GB ones (see `store.CheckpointStore`)."""

from libs.checkpoint.store import CheckpointManifest, CheckpointStore
from libs.checkpoint.tree import clone_tree, tree_bytes, trees_equal

__all__ = ["CheckpointManifest", "CheckpointStore", "clone_tree", "tree_bytes", "trees_equal"]
