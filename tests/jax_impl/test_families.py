"""jax_impl on the model families of issue 15 (Gemma 2, Gemma 3 text, OLMo 2, GPT-NeoX parallel and sequential,
Mistral's sliding window) against transformers' own classes, on checkpoints they wrote (tests/hf_models.py
FAMILY_CONFIGS): float32 logits and hidden states, bfloat16 no worse than transformers' own, greedy generation
past every sliding window, the fused path, the layer-streamed path, gradients, and tensor parallelism.

Sequences are longer than every window (5 to 7), so a missing or misplaced window shows; transformers runs its
eager attention (parity.capture), its plain reference code.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from parity.capture import capture
from tests.backends import load, rel_err
from tests.hf_configs import FAMILY_CONFIGS

pytest.importorskip("transformers")

FAMILIES = list(FAMILY_CONFIGS)
# float32: the same ops in fp32 on both sides, differing in summation order only; 1e-5 is the bound.
FP32_REL = 1e-5
# bfloat16: jax's bf16 logits no further from its float32 logits than transformers' bf16 from its float32, x 1.5.
BF16_FACTOR = 1.5
# Gradients: the float32 gradient table's bound sqrt(1 + L) * 1e-5 (parity/tolerances.py: GRAD_TOLERANCES).
GRAD_REL = 1e-5
SEQ = 21  # longer than every window
NEW_TOKENS = 28  # generated tokens, all past the window (prompt 9)


def ids_for(name: str, batch: int = 2, seq: int = SEQ, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, FAMILY_CONFIGS[name]["vocab_size"], (batch, seq))


@pytest.mark.parametrize("name", FAMILIES)
def test_float32_logits_and_hidden_states_match_transformers(name, hf_checkpoint):
    directory = hf_checkpoint(name)
    ids = ids_for(name)
    hf = capture("hf", directory, ids, dtype="float32").trace
    jx = capture("jax", directory, ids, dtype="float32").trace
    assert jx["logits"].shape == hf["logits"].shape
    errors = {"logits": rel_err(jx["logits"], hf["logits"]), "final_norm": rel_err(jx["final_norm"], hf["final_norm"])}
    np.testing.assert_array_equal(jx["embed"], hf["embed"])  # a gather and (Gemma) one rounded multiply
    for i in range(FAMILY_CONFIGS[name]["num_hidden_layers"] - 1):
        errors[f"layers.{i}.x2"] = rel_err(jx[f"layers.{i}.x2"], hf[f"layers.{i}.x2"])
    print(f"{name}: float32 rel errors {errors}")
    assert all(err <= FP32_REL for err in errors.values()), errors


@pytest.mark.parametrize("name", FAMILIES)
def test_bfloat16_no_worse_than_transformers_bfloat16(name, hf_checkpoint):
    directory = hf_checkpoint(name)
    # 8 rows: the max over [2, 23] logits is one rounding's luck (mistral_window, seed 1: 1.57x, the torch twin's
    # error bit-identical, the rms ratio 0.95); over [8, 23] every family measured <= 1.34x, rms 0.87 to 1.04.
    ids = ids_for(name, batch=8, seq=23, seed=1)
    hf32 = capture("hf", directory, ids, dtype="float32").trace["logits"]
    hf_err = np.abs(capture("hf", directory, ids, dtype="bfloat16").trace["logits"] - hf32).max()
    assert hf_err > 0  # bf16 really is coarser: the comparison below is not vacuous
    jx32 = capture("jax", directory, ids, dtype="float32").trace["logits"]
    err = np.abs(capture("jax", directory, ids, dtype="bfloat16").trace["logits"] - jx32).max()
    print(f"{name}: bf16 max abs error jax {err:.4g}, transformers {hf_err:.4g} (ratio {err / hf_err:.3f})")
    assert err <= BF16_FACTOR * hf_err, f"bf16 error {err:.4g} vs transformers' {hf_err:.4g}"


def greedy_hf(directory: Path, ids: np.ndarray, n: int) -> list[int]:
    import torch
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(
        directory, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    out = model.generate(torch.as_tensor(ids), max_new_tokens=n, do_sample=False, eos_token_id=None, pad_token_id=0)
    return out[0, ids.shape[1] :].tolist()


@pytest.mark.parametrize("name", FAMILIES)
def test_greedy_past_the_window_matches_transformers(name, hf_checkpoint):
    import jax_impl

    directory = hf_checkpoint(name)
    ids = np.random.default_rng(4).integers(0, FAMILY_CONFIGS[name]["vocab_size"], (1, 9))
    out = jax_impl.generate(load("jax", directory), ids, NEW_TOKENS, eos_token_ids=(), return_logits=True)
    ours, theirs = out.tokens[0], greedy_hf(directory, ids, NEW_TOKENS)
    assert len(ours) == NEW_TOKENS
    for step, (a, b) in enumerate(zip(ours, theirs, strict=True)):
        if a != b:  # allowed only at a real near-tie of the top two logits, and reported
            top2 = np.sort(out.logits[step][0])[-2:]
            gap = float(top2[1] - top2[0])
            assert gap < FP32_REL * np.abs(out.logits[step][0]).max(), f"step {step}: {a} != {b} (gap {gap})"
            print(f"{name}: near-tie at step {step}, gap {gap:.3g}")
            break


@pytest.mark.parametrize("name", ["mistral_window", "gemma3_local_global"])
def test_left_padded_batch_generation_matches_transformers(name, hf_checkpoint):
    """Two prompts of different lengths, left-padded: padding counts as window slots on both sides."""
    import torch
    import transformers

    import jax_impl

    directory = hf_checkpoint(name)
    ids = np.random.default_rng(5).integers(1, FAMILY_CONFIGS[name]["vocab_size"], (2, 11))
    mask = np.ones_like(ids)
    mask[1, :4], ids[1, :4] = 0, 0  # row 1: 7 tokens after 4 padding slots
    ours = jax_impl.generate(load("jax", directory), ids, 16, attention_mask=mask, eos_token_ids=()).tokens
    hf = transformers.AutoModelForCausalLM.from_pretrained(
        directory, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    out = hf.generate(
        torch.as_tensor(ids), attention_mask=torch.as_tensor(mask), max_new_tokens=16, do_sample=False,
        eos_token_id=None, pad_token_id=0,
    )  # fmt: skip
    assert ours == out[:, ids.shape[1] :].tolist()


@pytest.mark.parametrize("name", ["gemma2_sandwich", "mistral_window", "olmo2_post", "neox_parallel"])
def test_fused_path_matches_reference(name, hf_checkpoint):
    """kernels='fused' (Pallas interpreted on CPU) against the reference."""
    directory = hf_checkpoint(name)
    ids = ids_for(name, batch=1)
    ref = capture("jax", directory, ids, dtype="float32").trace["logits"]
    fused = capture("jax", directory, ids, dtype="float32", kernels="fused").trace["logits"]
    print(f"{name}: fused vs reference rel error {rel_err(fused, ref):.3g}")
    assert rel_err(fused, ref) <= FP32_REL


@pytest.mark.parametrize("name", FAMILIES)
def test_layer_streamed_matches_whole_model(name, hf_checkpoint):
    from jax_impl.layerwise import Layerwise

    directory = hf_checkpoint(name)
    ids = ids_for(name, batch=1)
    whole = capture("jax", directory, ids, dtype="float32").trace
    pieces = Layerwise(directory)
    trace: dict = {}
    boundary = pieces.embed(ids, trace)
    for i in range(FAMILY_CONFIGS[name]["num_hidden_layers"]):
        (boundary,) = pieces.run_layer(i, [boundary], [trace])
    (logits,) = pieces.head([boundary], [trace])
    assert sorted(trace) == sorted(whole)  # the same components, by the same names
    for key, value in whole.items():  # the same math compiled as separate programs: fusion reorders float32 ops
        assert rel_err(np.asarray(trace[key]), value) <= FP32_REL, key


@pytest.mark.parametrize("name", FAMILIES)
def test_gradients_match_transformers(name, hf_checkpoint):
    """loss_and_grads (by checkpoint name, [out, in]) against transformers' autograd of its own loss."""
    from jax_impl import training
    from parity.hf_training import hf_loss_and_grads

    directory = hf_checkpoint(name)
    # Ids 0 and 1 included: the pad rows of Gemma (pad_token_id 0) and OLMo 2 (1) get no gradient from the lookup in
    # transformers (nn.Embedding(padding_idx)) and in both backends (spec pad_token_id)
    ids = np.random.default_rng(0).integers(0, FAMILY_CONFIGS[name]["vocab_size"], (2, SEQ))
    ids[0, 3], ids[1, 5] = 0, 1
    loss, grads = training.loss_and_grads(load("jax", directory), ids)
    hf_loss, hf_grads = hf_loss_and_grads(directory, ids, dtype="float32")  # by checkpoint name: GPT-NeoX's embed_out
    assert sorted(grads) == sorted(hf_grads)
    assert abs(loss - hf_loss) <= 1e-6 * abs(hf_loss)
    bound = GRAD_REL * (1 + FAMILY_CONFIGS[name]["num_hidden_layers"]) ** 0.5
    worst = max((rel_err(grads[n], hf_grads[n]), n) for n in grads)
    print(f"{name}: loss {loss:.6f}, worst gradient rel error {worst[0]:.3g} ({worst[1]})")
    assert worst[0] <= bound, worst


def test_fused_qkv_with_projection_norm_is_refused():
    """A combination no family has and no layer here computes is refused by the spec, by name."""
    import spec

    with pytest.raises(spec.ConfigError, match="fused_qkv with a q/k norm"):
        dataclasses.replace(
            spec.DEFAULT_SPEC, num_key_value_heads=spec.DEFAULT_SPEC.num_attention_heads, fused_qkv=True,
            qk_norm=True, qk_norm_scope="projection",
        )  # fmt: skip


# Tensor parallelism (tp 2 on simulated CPU devices, in a subprocess: the device count is set before JAX starts):
# per family, the sharded forward's logits against the unsharded model's, greedy tokens past the window, and the
# loss and gradients (the bound at the deepest config, L = 4).
TP_SCRIPT = textwrap.dedent(
    """
    import json, sys
    from parity.environment import prepare_environment
    prepare_environment(tp=2)
    import numpy as np
    import jax_impl
    from jax_impl import tensor_parallel, training
    from jax_impl.vocab_parallel import gather_logits
    out = {}
    mesh = tensor_parallel.make_mesh(2)
    for name_dir in sys.argv[1:]:
        name, directory = name_dir.split("=", 1)
        ref = jax_impl.from_pretrained(directory)
        model = jax_impl.from_pretrained(directory, mesh=mesh)
        ids = np.random.default_rng(0).integers(0, ref.spec.vocab_size, (2, 21))
        full = np.asarray(ref(ids))
        sharded = np.asarray(gather_logits(tensor_parallel.sharded_logits(model, ids, mesh), ref.spec.vocab_size))
        prompt = ids[:1, :9]
        alone = jax_impl.generate(ref, prompt, 20, eos_token_ids=()).tokens
        split = jax_impl.generate(model, prompt, 20, eos_token_ids=(), mesh=mesh).tokens
        loss, grads = training.loss_and_grads(model, ids)
        ref_loss, ref_grads = training.loss_and_grads(ref, ids)
        out[name] = {
            "rel_err": float(np.abs(sharded - full).max() / np.abs(full).max()),
            "greedy_identical": alone == split,
            "loss_rel": abs(loss - ref_loss) / ref_loss,
            "grad_rel": max(float(np.abs(grads[k] - ref_grads[k]).max() / np.abs(ref_grads[k]).max()) for k in grads),
        }
    print(json.dumps(out))
    """
)


# The families whose placements differ most: Gemma 3's single kv head replicated over the devices and its local
# RoPE, OLMo 2's projection-wide q/k norm (sharded with the heads, reduced over them), GPT-NeoX's per-head fused
# qkv and row-parallel biases. The other three were checked the same way by hand (logits <= 7.4e-7, greedy
# identical); CI has 2 cores, and each family costs a JAX compile of the sharded model.
TP_FAMILIES = ("gemma3_local_global", "olmo2_post", "neox_parallel")


def test_tensor_parallel_tp2_families(hf_checkpoint):
    directories = [f"{name}={hf_checkpoint(name)}" for name in TP_FAMILIES]
    result = subprocess.run(
        [sys.executable, "-c", TP_SCRIPT, *directories],
        capture_output=True, text=True, timeout=900, cwd=Path(__file__).parents[2],
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-4000:]
    out = json.loads(result.stdout.strip().splitlines()[-1])
    print(f"tp 2: {out}")
    assert sorted(out) == sorted(TP_FAMILIES)
    for family, measured in out.items():
        assert measured["rel_err"] <= FP32_REL, family
        assert measured["greedy_identical"], family
        assert measured["loss_rel"] <= 1e-6 and measured["grad_rel"] <= GRAD_REL * (1 + 4) ** 0.5, family
