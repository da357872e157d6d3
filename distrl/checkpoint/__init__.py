"""Everything about checkpoints: atomic weight and JSON files (`files`), whole-run checkpoint
directories (`run`, which loads torch) and the replay's store.npz (`store_file`, which does not)."""
from distrl.checkpoint.files import CheckpointError, load_weights, save_json, save_weights

__all__ = ["CheckpointError", "load_weights", "save_json", "save_weights"]
