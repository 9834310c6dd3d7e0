"""Model folders: the embedded default model and provenance hashes of any model folder."""

from gate.models.default import DEFAULT_MODEL, default_model_dir, materialize_default, resolve_model_path
from gate.models.hashing import local_model_dir, tokenizer_sha256, weights_sha256

__all__ = [
    "DEFAULT_MODEL",
    "default_model_dir",
    "local_model_dir",
    "materialize_default",
    "resolve_model_path",
    "tokenizer_sha256",
    "weights_sha256",
]
