"""decoder-parity's JAX/Flax NNX backend: the decoders of spec/families.py (Qwen3, Qwen2, Llama, Mistral, Gemma 2,
Gemma 3 text, OLMo 2, GPT-NeoX) from one `spec.ModelSpec`.

Twin of `torch_impl` (same file, class and attribute names). Imports JAX and never torch.
"""

from jax_impl.generate import generate
from jax_impl.kv_cache import KVCache
from jax_impl.loader import DTYPES, from_pretrained
from jax_impl.model import CausalLM, Model, forward

__all__ = ["DTYPES", "CausalLM", "KVCache", "Model", "generate", "forward", "from_pretrained"]
