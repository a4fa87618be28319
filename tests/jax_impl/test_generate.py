"""jax_impl.generate: the generation behaviour both twins share (tests/twins/generate.py), then what only
JAX has to prove: a decode step compiles once, and runs on the device the model is on."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import jax

import jax_impl
from tests.twins.generate import GenerateTwin

# every new program is lowered before XLA compiles it or the test run's persistent compilation cache serves it
# (tests/conftest.py), so counting lowerings counts new programs whichever of the two happens
LOWERING = "jaxpr_to_mlir_module_duration"


class TestGenerateTwin(GenerateTwin):
    backend = "jax"


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
    # stream(step) runs before decode step `step + 1` is launched: steps 2..11 must reuse step 1's program
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
