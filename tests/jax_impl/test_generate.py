"""jax_impl.generate: the generation behaviour both twins share (tests/twins/generate.py), its sampler at the smallest
temperature allowed, then what only JAX has to prove: a decode step compiles once, and runs on the device the model is
on."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp

import jax_impl
from spec.generation import MIN_TEMPERATURE, SamplingParams
from tests.twins.generate import GenerateTwin

generate_module = importlib.import_module("jax_impl.generate")  # the module, not the function the package exports

# every new program is lowered before XLA compiles it or the test run's persistent compilation cache serves it
# (tests/conftest.py), so counting lowerings counts new programs whichever of the two happens
LOWERING = "jaxpr_to_mlir_module_duration"


class TestGenerateTwin(GenerateTwin):
    backend = "jax"


def test_the_smallest_temperature_samples_each_rows_maximum():
    """30 / MIN_TEMPERATURE overflows float32: unshifted, two logits of a row become inf: the first one wins."""
    logits = jnp.array([[29.0, 1.0, 30.0], [39.5, -5.0, 40.0]])
    tokens = generate_module.sample(logits, SamplingParams(temperature=MIN_TEMPERATURE), jax.random.key(0))
    assert tokens.tolist() == [2, 2]  # unshifted, the first inf would win a tie


def test_decode_step_compiles_once(default_dir):
    """Counts programs lowered for XLA (jax.monitoring): none after the first decode step, none on a repeat."""
    compiles = []
    jax.monitoring.register_event_duration_secs_listener(
        lambda event, _seconds, **_kw: compiles.append(event) if event.endswith(LOWERING) else None
    )
    model = jax_impl.from_pretrained(default_dir)
    at_step = []
    jax_impl.generate(model, [[1, 2, 3]], 12, eos_token_ids=(), stream=lambda step, _t: at_step.append(len(compiles)))
    assert len(at_step) == 12
    # stream(step) runs after decode step `step + 1` is launched (dispatched first): steps 2..11 reuse step 1's program
    assert at_step[-1] == at_step[2], f"compilations during decoding: {at_step}"
    before = len(compiles)
    jax_impl.generate(model, [[4, 5, 6]], 12, eos_token_ids=())  # same request shape
    assert len(compiles) == before, "a repeated request shape must not compile again"


PLACEMENT_SCRIPT = """
import sys
import jax
from parity.environment import prepare_environment
prepare_environment(tp=2)  # two CPU devices, before JAX starts
import jax_impl
second = jax.devices()[1]
with jax.default_device(second):
    model = jax_impl.from_pretrained(sys.argv[1])
    with jax.transfer_guard_device_to_device("disallow"):  # a step on the first device would move the model there
        out = jax_impl.generate(model, [[1, 2, 3]], 4, eos_token_ids=())
print(len(out.tokens[0]), model.model.embed_tokens.weight[...].devices() == {second})
"""


def test_decode_steps_stay_on_the_models_device(default_dir):
    """A model on another device than jax.devices()[0] (jax.default_device: a CPU reference beside a GPU, here the
    second of two CPU devices) decodes there: every step's inputs are placed where the prompt ran."""
    result = subprocess.run(
        [sys.executable, "-c", PLACEMENT_SCRIPT, str(default_dir)],
        capture_output=True, text=True, timeout=300, cwd=Path(__file__).parents[2],
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-4000:]
    assert result.stdout.split() == ["4", "True"], result.stdout


def test_a_models_split_is_reused_only_while_it_holds(default_dir):
    """split_model keeps nnx.split's result per model: the same graph definition, leaves and structure as a fresh
    split; a parameter given a new array is read from the model (the generation follows it); a changed structure
    splits afresh."""
    import jax.numpy as jnp
    import numpy as np
    from flax import nnx

    from jax_impl.generate import split_model

    model = jax_impl.from_pretrained(default_dir)
    for _ in range(2):  # the first call splits, the second reuses
        graphdef, leaves, treedef = split_model(model)
        fresh_def, state = nnx.split(model)
        fresh, fresh_tree = jax.tree.flatten(state)
        assert graphdef == fresh_def and treedef == fresh_tree
        assert len(leaves) == len(fresh) and all(a is b for a, b in zip(leaves, fresh, strict=True))
    prompt = [[5, 9, 200, 17]]
    before = jax_impl.generate(model, prompt, 4, eos_token_ids=(), return_logits=True)
    norm = model.model.norm.weight
    norm[...] = jnp.zeros_like(norm[...])  # a new array in place of the final norm's weight: every logit is 0
    assert any(leaf is norm[...] for leaf in split_model(model)[1])
    after = jax_impl.generate(model, prompt, 4, eos_token_ids=(), return_logits=True)
    assert np.abs(before.logits[0]).max() > 0 and np.abs(after.logits[0]).max() == 0
    model.model.layers[0].mlp.extra = nnx.Param(jnp.ones(3))  # a new parameter: the structure changed
    graphdef, leaves, _ = split_model(model)
    assert graphdef == nnx.split(model)[0] and len(leaves) == len(fresh) + 1
    first = model.model.layers[0].input_layernorm.weight
    first[...] = norm[...]  # one array in two Variables when the model is split again: that split is not kept,
    model.model.layers[0].mlp.more = nnx.Param(jnp.ones(2))  # so replacing one of them afterwards is still seen
    split_model(model)
    norm[...] = jnp.ones_like(norm[...])
    leaves = split_model(model)[1]
    assert any(leaf is norm[...] for leaf in leaves) and any(leaf is first[...] for leaf in leaves)


def test_an_unchanged_models_steps_are_found_without_hashing_its_graph(default_dir, monkeypatch):
    """compiled_steps finds the pair it gave for the same graph definition object without hashing it again (a walk
    of the whole graph); an equal graph definition of another object, or another kernel setting, still finds its own
    pair through the hashed cache."""
    from flax import nnx

    from jax_impl.generate import SamplingParams, compiled_steps, split_model
    from kernels.cpu import jax_decode_ops

    model = jax_impl.from_pretrained(default_dir)
    graphdef, _, treedef = split_model(model)
    params = SamplingParams(0.0, None, None, 0)
    first = compiled_steps(graphdef, treedef, params)

    def refuse(_self):
        raise AssertionError("hashed again")

    with monkeypatch.context() as patch:
        patch.setattr(type(graphdef), "__hash__", refuse)
        assert compiled_steps(split_model(model)[0], treedef, params) is first
    assert compiled_steps(nnx.split(model)[0], treedef, params) == first  # equal, another object: hashed, found
    with jax_decode_ops.reference_only():
        assert compiled_steps(graphdef, treedef, params) != first


def test_the_next_step_is_dispatched_before_the_host_reads_a_token(default_dir, monkeypatch):
    """generate dispatches step s + 1 before it copies step s's token, streams it and checks for the end: the stream
    sees every token in order; without an end, max_new_tokens - 1 decode steps run, no more; where every row ends at
    step s, the one step dispatched after it is dropped, and the tokens are those of a generation without the end."""
    dispatched = []
    compiled = generate_module.compiled_steps

    def counting(*args, **kwargs):
        prefill, decode = compiled(*args, **kwargs)
        return prefill, lambda *a: dispatched.append(1) or decode(*a)

    monkeypatch.setattr(generate_module, "compiled_steps", counting)
    model = jax_impl.from_pretrained(default_dir)
    streamed = []
    free = jax_impl.generate(model, [[1, 2, 3]], 8, eos_token_ids=(), stream=lambda s, t: streamed.append((s, t[0])))
    assert len(dispatched) == 7 and streamed == [(s, t) for s, t in enumerate(free.tokens[0])]
    end = free.tokens[0][3]
    first = free.tokens[0].index(end)  # the step at which that token first appears
    dispatched.clear()
    ended = jax_impl.generate(model, [[1, 2, 3]], 8, eos_token_ids=(end,))
    assert len(dispatched) == first + 1  # steps 1 .. first, and the one dropped after the end
    assert list(ended.tokens[0]) == list(free.tokens[0][: first + 1])
