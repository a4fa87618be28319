"""decoder-parity's framework-neutral core: the model spec, the parameter table, checkpoints.

Imports numpy, safetensors' format (parsed here) and ml_dtypes only; both backends build on it.
"""

from spec.checkpoint import Checkpoint, allow_nonfinite_weights, runtime_params, write_checkpoint
from spec.config import ModelSpec
from spec.default import DEFAULT_SPEC, default_checkpoint, random_weights
from spec.errors import CheckpointError, ConfigError, DecoderParityError, InputError
from spec.inputs import DTYPE_NAMES, check_attention_mask, check_positions, check_token_ids, dtype_name
from spec.params import ParamEntry, param_table, parameter_count, runtime_groups
from spec.rope import RopeScaling, rope_inv_freq
from spec.validate import validate_checkpoint

__all__ = [
    "DEFAULT_SPEC",
    "DTYPE_NAMES",
    "Checkpoint",
    "CheckpointError",
    "ConfigError",
    "DecoderParityError",
    "InputError",
    "ModelSpec",
    "ParamEntry",
    "RopeScaling",
    "allow_nonfinite_weights",
    "check_attention_mask",
    "check_positions",
    "check_token_ids",
    "default_checkpoint",
    "dtype_name",
    "param_table",
    "parameter_count",
    "random_weights",
    "rope_inv_freq",
    "runtime_groups",
    "runtime_params",
    "validate_checkpoint",
    "write_checkpoint",
]
