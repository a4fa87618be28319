"""decoder-parity's PyTorch backend: every family spec/families.py reads (Qwen3, Qwen2, Llama, Mistral, Gemma 2,
Gemma 3 text, OLMo 2, GPT-NeoX) from one `spec.ModelSpec`.

Twin of `jax_impl` (same file, class and attribute names). Imports torch and never JAX.
"""

from torch_impl.generate import generate
from torch_impl.kv_cache import KVCache
from torch_impl.loader import DTYPES, from_pretrained
from torch_impl.model import CausalLM, Model

__all__ = ["DTYPES", "CausalLM", "KVCache", "Model", "generate", "from_pretrained"]
