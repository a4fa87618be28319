"""One input boundary for both backends (spec/inputs.py, issue 17): the same ids, positions, masks, dtypes and seeds
are accepted or refused by torch_impl and jax_impl alike, with the same message; generation's padding is checked
against transformers; loaders validate before they allocate and refuse non-finite weights."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

import jax_impl
import spec
import torch_impl
from spec import CheckpointError, InputError

BACKENDS = {"torch": torch_impl, "jax": jax_impl}
IDS = np.array([[3, 1, 4, 1, 5, 9], [2, 6, 5, 3, 5, 8]])


@pytest.fixture(scope="module")
def models(default_dir):
    return {name: package.from_pretrained(default_dir) for name, package in BACKENDS.items()}


def logits(model, ids, **kwargs) -> np.ndarray:
    out = model(ids, **kwargs)
    return out.detach().numpy() if hasattr(out, "detach") else np.asarray(out)


def refusals(models, call) -> dict[str, str]:
    """The InputError message each backend gives for `call(model)` or `call(model, name)` (both must raise)."""
    messages = {}
    for name, model in models.items():
        with pytest.raises(InputError) as err:
            call(model) if call.__code__.co_argcount == 1 else call(model, name)
        messages[name] = str(err.value)
    return messages


@pytest.mark.parametrize("dtype", [np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32, np.int64, np.uint64])
def test_every_integer_id_dtype_gives_the_same_logits_in_both(models, dtype):
    for model in models.values():
        assert np.array_equal(logits(model, IDS.astype(dtype)), logits(model, IDS))


def test_torch_tensors_of_small_integer_dtypes(models):
    import torch

    ids = torch.tensor(IDS, dtype=torch.int16)
    assert np.array_equal(logits(models["torch"], ids), logits(models["torch"], IDS))


@pytest.mark.parametrize(
    ("ids", "needle"),
    [
        (IDS.astype(np.float32), "input_ids must hold integer token ids, got dtype float32"),
        (IDS.astype(bool), "got dtype bool"),
        ([[1, 2, 3], [4, 5]], "input_ids must be a rectangular array"),
        ([[1, 2**70]], "rectangular array of integers"),
    ],
)
def test_bad_ids_get_the_same_message_from_both(models, ids, needle):
    messages = refusals(models, lambda m: m(ids))
    assert messages["torch"] == messages["jax"] and needle in messages["torch"]


def test_positions_numpy_or_framework_any_integer_dtype(models):
    import torch

    explicit = np.tile(np.arange(6), (2, 1))
    for name, model in models.items():
        default = logits(model, IDS)
        assert np.array_equal(logits(model, IDS, positions=explicit.astype(np.int16)), default), name
    assert np.array_equal(
        logits(models["torch"], IDS, positions=torch.as_tensor(explicit)), logits(models["torch"], IDS)
    )
    shifted = logits(models["torch"], IDS, positions=explicit + 100)
    assert np.allclose(shifted, logits(models["jax"], IDS, positions=explicit + 100), atol=1e-4)


@pytest.mark.parametrize(
    ("positions", "needle"),
    [
        (np.full((2, 6), 512), "positions[0, 0] = 512 is outside [0, 512) (max_position_embeddings)"),
        (np.full((2, 6), -1), "positions[0, 0] = -1 is outside [0, 512)"),
        (np.zeros((1, 6), np.int64), "positions has shape [1, 6], expected [2, 6] like the ids"),
        (np.zeros((2, 6), np.float32), "positions must hold integer positions, got dtype float32"),
    ],
)
def test_bad_positions_get_the_same_message_from_both(models, positions, needle):
    messages = refusals(models, lambda m: m(IDS, positions=positions))
    assert messages["torch"] == messages["jax"] and needle in messages["torch"]


@pytest.mark.parametrize(
    ("mask", "needle"),
    [
        (np.array([[1] * 6, [0] * 6]), "attention_mask row 1 is all zeros"),
        (np.array([[1] * 6, [1, 1, 2, 1, 1, 1]]), "attention_mask[1, 2] = 2: a mask holds only 0 and 1"),
        (np.ones((2, 6), np.float32), "attention_mask must hold 0/1 (integer or bool), got dtype float32"),
        (np.ones((2, 5), np.int64), "attention_mask has shape [2, 5], expected [2, 6]"),
    ],
)
def test_bad_masks_get_the_same_message_from_both(models, mask, needle):
    messages = refusals(models, lambda m: m(IDS, attention_mask=mask))
    assert messages["torch"] == messages["jax"] and needle in messages["torch"]


def generate(name, model, ids, mask, **kwargs):
    return BACKENDS[name].generate(model, ids, 5, attention_mask=mask, **kwargs).tokens


def test_right_padded_generation_is_refused_naming_the_row(models):
    mask = np.array([[1] * 6, [1, 1, 1, 1, 0, 0]])
    messages = refusals(models, lambda model, name: generate(name, model, IDS, mask))
    assert messages["torch"] == messages["jax"]
    assert "attention_mask row 1 is not left-padded ([1, 1, 1, 1, 0, 0])" in messages["torch"]


def test_left_padded_generation_matches_transformers(models, default_dir):
    """The padding form generation accepts gives transformers' tokens (greedy, float32), in both backends."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    hf = transformers.AutoModelForCausalLM.from_pretrained(default_dir, dtype=torch.float32)
    ids = np.array([[0, 0, 7, 8, 9, 10], [11, 12, 13, 14, 15, 16]])
    mask = np.array([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]])
    out = hf.generate(
        input_ids=torch.as_tensor(ids), attention_mask=torch.as_tensor(mask), max_new_tokens=5, do_sample=False,
        pad_token_id=0, eos_token_id=None,
    )  # fmt: skip
    expected = out[:, ids.shape[1] :].tolist()
    for name, model in models.items():
        assert generate(name, model, ids, mask, eos_token_ids=()) == expected, name


def test_out_of_range_seed_is_refused_by_both(models):
    messages = refusals(
        models, lambda m: generate("torch" if m is models["torch"] else "jax", m, IDS, None, seed=2**70)
    )
    assert messages["torch"] == messages["jax"] and "seed must be an integer in [0, 2**63)" in messages["torch"]


@pytest.mark.parametrize("name", sorted(BACKENDS))
def test_unsupported_dtype_string_is_an_input_error(default_dir, name):
    with pytest.raises(InputError, match=r"dtype 'float64' is not supported \(choose: float32, bfloat16, float16\)"):
        BACKENDS[name].from_pretrained(default_dir, "float64")


@pytest.mark.parametrize("name", sorted(BACKENDS))
@pytest.mark.parametrize(
    ("change", "needle"),
    [
        ({"num_hidden_layers": 10**7}, "num_hidden_layers is 10000000"),
        ({"intermediate_size": 10**8}, "expected [100000000, 64]"),  # ~77 GB if allocated before validating
        ({"vocab_size": 2**30}, "rows but vocab_size is 1073741824"),
    ],
)
def test_loaders_validate_before_allocating(default_dir, tmp_path, monkeypatch, name, change, needle):
    directory = shutil.copytree(default_dir, tmp_path / "ckpt")
    config = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps({**config, **change}))
    built = []  # the real model class, spied on: validation must refuse before any model is built
    loader = BACKENDS[name].loader
    monkeypatch.setattr(loader, "CausalLM", lambda *a, _cls=loader.CausalLM, **k: built.append(1) or _cls(*a, **k))
    with pytest.raises(CheckpointError) as err:
        BACKENDS[name].from_pretrained(directory)
    assert needle in str(err.value) and built == []


@pytest.mark.parametrize("name", sorted(BACKENDS))
def test_loaders_refuse_nonfinite_weights_unless_allowed(tmp_path, name):
    tensors = spec.random_weights(spec.DEFAULT_SPEC)
    tensors["model.layers.0.self_attn.k_proj.weight"][3, 5] = np.inf
    directory = spec.write_checkpoint(tmp_path / "ckpt", spec.DEFAULT_SPEC, tensors)
    with pytest.raises(CheckpointError, match=r"tensor 'model.layers.0.self_attn.k_proj.weight' holds 1 non-finite"):
        BACKENDS[name].from_pretrained(directory)
    with spec.allow_nonfinite_weights():
        model = BACKENDS[name].from_pretrained(directory)
    assert not np.isfinite(logits(model, IDS)).all()  # loaded as it is, for debugging the export
