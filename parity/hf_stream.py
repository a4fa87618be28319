"""transformers as a streamed reference (`check --reference hf --stream`): its own classes, one layer at a time.

The twin of torch_impl/layerwise.py and jax_impl/layerwise.py for transformers: the same pieces (embed,
run_layer, head) from the same memory-mapped tensors (spec/layerwise.py), each built from transformers' own
classes for the checkpoint's family, found by name in its modeling module (`Qwen3DecoderLayer`,
`Qwen3RotaryEmbedding`, `Qwen3RMSNorm`, ...), and dropped before the next loads. Nothing of theirs is copied but
one formula (below): a layer is one `XxxDecoderLayer(config, layer_idx)` given its checkpoint tensors by
`load_state_dict` (strict), run with their rotary embedding module's (cos, sin) and the mask their mask functions
make for the config, eager attention as in parity/hf_reference.py. The embedding and the head are the torch
modules transformers' models use (`nn.Embedding`, `nn.Linear`), the head's table read in blocks of rows.

Each layer gets the mask transformers' own model would give it (`FAMILIES`: causal, or a sliding window by the
config's layer types or for every layer where the config sets one), and what the family's model does around its
layers is done too: Gemma's embedding through its own scaled-embedding class, Gemma 3's rotary tables per layer type
from its own rotary module, and the final logit softcap Gemma's causal-LM class applies to the head's output,
`tanh(logits / cap) * cap` (the one formula of theirs this stream writes out: it is in their `forward`, no module).
GPT-NeoX's layer class is `GPTNeoXLayer` and its final norm torch's LayerNorm. A family the table does not describe (the
MoE families) is refused with the alternatives, never run half-faithfully.

Its trace holds what a whole transformers model exposes (parity/components.py: `hf_components`) and x2 of
the last layer too; a `Boundary` is the hidden state x itself, which is what its layers pass on.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from parity.hf_reference import _quiet_transformers, hf_available
from spec import Checkpoint, InputError, ModelSpec, check_token_ids, param_table
from spec.layerwise import embedding_rows, final_norm_module, head_blocks, layer_prefix


@dataclass(frozen=True)
class Streamed:
    """What transformers' own model of a family is made of and does around its layers, as this stream repeats it: how
    it picks each layer's mask (by the config's `layer_types`, by whether the config sets a `sliding_window`, every
    layer alike, or always causal), its layer class and final norm, whether its embedding is its
    `XxxTextScaledWordEmbedding`, whether its rotary module takes the layer type, and whether its head's logits are
    soft-capped."""

    mask: str
    layer: str = "DecoderLayer"  # the layer class's name after the family's: `Qwen3DecoderLayer`, `GPTNeoXLayer`
    layer_norm: bool = False  # the final norm is torch's LayerNorm (weight and bias), not the family's RMSNorm
    scaled_embedding: bool = False
    rope_by_kind: bool = False
    softcap: bool = False
    module: str | None = None  # transformers' module directory, where it is not the model type


FAMILIES = {  # the MoE families are not streamed at all yet (parity/request.py refuses them first)
    "qwen3": Streamed("layer_types"),
    "qwen2": Streamed("layer_types"),
    "mistral": Streamed("sliding_window"),
    "llama": Streamed("causal"),
    "olmo2": Streamed("causal"),
    "gemma2": Streamed("layer_types", scaled_embedding=True, softcap=True),
    "gemma3_text": Streamed("layer_types", scaled_embedding=True, rope_by_kind=True, softcap=True, module="gemma3"),
    "gpt_neox": Streamed("causal", layer="Layer", layer_norm=True),
}
FULL, SLIDING = "full_attention", "sliding_attention"  # transformers' names of the two kinds


class HFLayerwise:
    """transformers' pieces for one checkpoint and dtype, built and run on demand; `load_s`, `run_s` add up."""

    def __init__(self, path: str | Path, dtype: str = "float32"):
        if not hf_available():
            raise InputError(
                "--reference hf needs Hugging Face transformers, which is not installed "
                "(pip install 'decoder-parity[hf]')"
            )
        import torch
        from transformers import AutoConfig
        from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

        self.torch = torch
        self.directory = Path(path)
        self.spec = ModelSpec.from_pretrained(path)
        self.dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]
        with _quiet_transformers(False):
            try:
                self.config = AutoConfig.from_pretrained(self.directory)
            except (OSError, ValueError, KeyError) as err:
                raise InputError(f"transformers cannot read the config of {self.directory}: {err}") from err
        self.config._attn_implementation = "eager"  # transformers' plain reference attention (hf_reference.py)
        if self.config.model_type not in FAMILIES:
            raise InputError(
                f"the streamed transformers reference (--stream with --reference hf) covers {', '.join(FAMILIES)}, "
                f"not {self.config.model_type}: run --reference hf on the whole model (without --stream), or --stream "
                "without --reference hf"
            )
        self.family = FAMILIES[self.config.model_type]
        family = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[self.config.model_type].removesuffix("ForCausalLM")  # "Qwen3"
        module = self.family.module or self.config.model_type
        modeling = importlib.import_module(f"transformers.models.{module}.modeling_{module}")
        self.layer_class = getattr(modeling, f"{family}{self.family.layer}")
        self.norm_class = None if self.family.layer_norm else getattr(modeling, f"{family}RMSNorm")
        self.rotary = getattr(modeling, f"{family}RotaryEmbedding")(config=self.config)
        self.embedding_class = (
            getattr(modeling, f"{family}TextScaledWordEmbedding") if self.family.scaled_embedding else None
        )
        self._rope: tuple | None = None  # (position embeddings by kind, masks by kind, position ids) of the batch
        self.load_s = self.run_s = 0.0

    @contextlib.contextmanager
    def _running(self) -> Iterator[None]:
        start = time.perf_counter()
        with self.torch.inference_mode():
            yield
        self.run_s += time.perf_counter() - start

    def _tensor(self, array: np.ndarray):
        """numpy (float32 / float16 / ml_dtypes.bfloat16) -> a torch tensor in this dtype with its own memory."""
        if array.dtype.name == "bfloat16":  # numpy has no bfloat16: move the bits, reinterpret in torch
            return self.torch.from_numpy(np.array(array).view(np.uint16)).view(self.torch.bfloat16).to(self.dtype)
        return self.torch.from_numpy(np.array(array)).to(self.dtype)

    def _empty(self, make):
        """`make()` on the meta device, then allocated in this dtype without the random initialization."""
        with self.torch.device("meta"):
            module = make()
        return module.to(self.dtype).to_empty(device="cpu").eval()

    def _layer_kind(self, index: int) -> str:
        """The kind of mask (and, in Gemma 3, rotary table) transformers' model gives layer `index` (FAMILIES)."""
        if self.family.mask == "layer_types":
            return self.config.layer_types[index]
        if self.family.mask == "sliding_window" and self.config.sliding_window is not None:
            return SLIDING
        return FULL

    def _masks(self, hidden, position_ids) -> dict:
        """{kind: transformers' own mask of that kind for the config (eager)}, for the kinds the layers use."""
        from transformers.masking_utils import create_causal_mask, create_sliding_window_causal_mask

        makers = {FULL: create_causal_mask, SLIDING: create_sliding_window_causal_mask}
        return {kind: self._mask(makers[kind], hidden, position_ids) for kind in self._kinds()}

    def _kinds(self) -> list[str]:
        return sorted({self._layer_kind(i) for i in range(self.spec.num_hidden_layers)})

    def _ropes(self, hidden, position_ids) -> dict:
        """{kind: (cos, sin)} from the family's rotary module: one table for every kind, or (Gemma 3) one each."""
        if not self.family.rope_by_kind:
            table = self.rotary(hidden, position_ids)
            return dict.fromkeys(self._kinds(), table)
        return {kind: self.rotary(hidden, position_ids, kind) for kind in self._kinds()}

    def _mask(self, create, hidden, position_ids):
        """One of transformers' mask functions for the config, called with the arguments its version names."""
        names = inspect.signature(create).parameters
        kwargs = {"config": self.config, "attention_mask": None, "position_ids": position_ids}
        kwargs["inputs_embeds" if "inputs_embeds" in names else "input_embeds"] = hidden
        kwargs["cache" if "cache" in names else "past_key_values"] = None
        if "cache_position" in names:
            kwargs["cache_position"] = self.torch.arange(hidden.shape[1])
        return create(**kwargs)

    def embed(self, ids: np.ndarray, trace: dict | None = None):
        ids = check_token_ids(ids, self.spec)
        torch = self.torch
        start = time.perf_counter()
        rows, inverse = embedding_rows(self.directory, self.spec, ids)  # rows [U, H], inverse [B, T]
        if self.embedding_class is None:
            table = self._empty(lambda: torch.nn.Embedding(*rows.shape))
        else:  # its scale is a buffer that an empty module would leave unset: built as the model builds it
            scale = self.config.hidden_size**0.5
            table = self.embedding_class(*rows.shape, None, embed_scale=scale).to(self.dtype).eval()
        with torch.no_grad():
            table.weight.copy_(self._tensor(rows))
        self.load_s += time.perf_counter() - start
        with self._running():
            hidden = table(torch.as_tensor(inverse))  # [B, T, H]
            position_ids = torch.arange(ids.shape[1])[None]  # [1, T], as the model makes them
            self._rope = (self._ropes(hidden, position_ids), self._masks(hidden, position_ids), position_ids)
        if trace is not None:
            trace["embed"] = hidden
        return hidden

    def boundary(self, x: np.ndarray, *, first_layer: bool):
        """Another run's x at a layer boundary as this reference's layer input (transformers passes x itself)."""
        return self.torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)).to(self.dtype)

    def run_layer(self, index: int, inputs: Sequence, traces: Sequence[dict | None]) -> list:
        if self._rope is None:
            raise InputError("run_layer before embed: a streamed forward starts with embed(ids)")
        start = time.perf_counter()
        prefix = layer_prefix(index)
        checkpoint = Checkpoint(self.directory)  # its own maps, released with it; validated by the caller
        marker = f"layers.{index}."  # the checkpoint's own prefix before it: "model.", "gpt_neox."
        names = {e.name for e in param_table(self.spec) if e.module.startswith(prefix)}
        layer = self._empty(lambda: self.layer_class(self.config, layer_idx=index))
        state = {name.split(marker, 1)[1]: self._tensor(checkpoint.get(name)) for name in names}
        layer.load_state_dict(state, strict=True)  # every tensor of the layer, no other
        del checkpoint, state
        self.load_s += time.perf_counter() - start
        ropes, masks, position_ids = self._rope
        kind = self._layer_kind(index)
        position_embeddings, mask = ropes[kind], masks[kind]
        outputs = []
        with self._running():
            for hidden, trace in zip(inputs, traces, strict=True):
                out = layer(
                    hidden, attention_mask=mask, position_ids=position_ids, position_embeddings=position_embeddings
                )
                out = out[0] if isinstance(out, tuple) else out  # older versions return (hidden,)
                if trace is not None:
                    trace[f"layers.{index}.x2"] = out
                outputs.append(out)
        return outputs

    def head(self, inputs: Sequence, traces: Sequence[dict | None]) -> list:
        torch = self.torch
        start = time.perf_counter()
        hidden_size = self.spec.hidden_size
        if self.family.layer_norm:
            norm = self._empty(lambda: torch.nn.LayerNorm(hidden_size, eps=self.config.layer_norm_eps))
        else:
            norm = self._empty(lambda: self.norm_class(hidden_size, eps=self.config.rms_norm_eps))
        module, checkpoint = final_norm_module(self.spec), Checkpoint(self.directory)
        names = {e.name for e in param_table(self.spec) if e.module == module}  # weight (and a LayerNorm's bias)
        norm.load_state_dict({n.rsplit(".", 1)[1]: self._tensor(checkpoint.get(n)) for n in names}, strict=True)
        del checkpoint
        self.load_s += time.perf_counter() - start
        with self._running():
            normed = [norm(hidden) for hidden in inputs]  # [B, T, H]
        blocks: list[list] = [[] for _ in inputs]
        for _start, _kind, block in head_blocks(self.directory, self.spec):
            start = time.perf_counter()
            head = self._empty(lambda n=block.shape[0]: torch.nn.Linear(self.spec.hidden_size, n, bias=False))
            with torch.no_grad():
                head.weight.copy_(self._tensor(block))
            self.load_s += time.perf_counter() - start
            with self._running():
                for out, x in zip(blocks, normed, strict=True):
                    out.append(head(x))  # [B, T, rows]
            del head, block
        logits = [torch.cat(out, dim=-1) for out in blocks]  # [B, T, V]
        if self.family.softcap and self.config.final_logit_softcapping is not None:
            cap = self.config.final_logit_softcapping
            with self._running():
                logits = [torch.tanh(x / cap) * cap for x in logits]
        for trace, final, full in zip(traces, normed, logits, strict=True):
            if trace is not None:
                trace["final_norm"] = final
                trace["logits"] = full
        return logits
