"""decoder-parity's JAX/Flax NNX backend: Qwen3 / Qwen2 / Llama decoders from one `spec.ModelSpec`.

Twin of `torch_impl` (same file, class and attribute names). Imports JAX and never torch.
"""

from jax_impl.loader import DTYPES, from_pretrained
from jax_impl.model import CausalLM, Model, forward

__all__ = ["DTYPES", "CausalLM", "Model", "forward", "from_pretrained"]
