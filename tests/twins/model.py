"""Behaviour both backends' models must share: known answers, the tied head, last-position logits, bad input,
and running with the other framework absent.

One body for both twins, so that they are held to one standard: tests/torch_impl/test_model.py and
tests/jax_impl/test_model.py subclass `ModelTwin` with their backend's name and its one framework-specific
piece (building an RMSNorm layer); pytest collects the subclasses, never this module.
"""

from __future__ import annotations

import importlib
import subprocess
import sys
import textwrap
from typing import Any, ClassVar

import numpy as np
import pytest

from spec import InputError
from tests.backends import load, rel_err, run, to_numpy

# Run in a subprocess: an import hook makes the other framework unimportable, then the backend loads the
# default checkpoint and runs a forward pass; any import of the blocked framework fails the run.
ISOLATED_RUN = """
import sys

class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {blocked!r}:
            raise ImportError("blocked for this test: " + name)
        return None

sys.meta_path.insert(0, Block())
import spec
import {backend}
model = {backend}.from_pretrained(spec.default_checkpoint({cache!r}))
logits = model([[1, 2, 3]])
assert tuple(logits.shape) == (1, 3, 263), logits.shape
leaked = sorted(m for m in sys.modules if m.split(".")[0] in {blocked!r})
assert not leaked, leaked
print("ok")
"""


class ModelTwin:
    backend: ClassVar[str]  # "torch" | "jax"
    other_framework: ClassVar[tuple[str, ...]]  # top-level modules this backend must run without

    def rms_norm(self, x: np.ndarray, weight: np.ndarray, eps: float, residual: np.ndarray | None = None) -> Any:
        """The backend's RMSNorm layer with `weight` applied to x (and residual): its output(s) as numpy."""
        raise NotImplementedError

    @pytest.fixture(scope="class")
    def model(self, default_dir):
        return load(self.backend, default_dir)

    def test_rms_norm_known_answer(self):
        out = self.rms_norm(np.array([[3.0, 4.0]], np.float32), np.ones(2, np.float32), eps=1e-30)
        np.testing.assert_allclose(out, [[0.8485281, 1.1313709]], rtol=1e-6)  # [3, 4] / sqrt(12.5)

    def test_rms_norm_with_residual_returns_sum_as_new_residual(self):
        x, r = np.array([[1.0, 1.0]], np.float32), np.array([[2.0, 3.0]], np.float32)
        out, new_residual = self.rms_norm(x, np.array([1.0, 2.0], np.float32), 1e-30, residual=r)
        np.testing.assert_array_equal(new_residual, [[3.0, 4.0]])
        np.testing.assert_allclose(out, [[0.8485281, 2 * 1.1313709]], rtol=1e-6)

    def test_repeated_ids_give_identical_embedding_rows(self, model):
        trace: dict = {}
        run(model, [[5, 17, 5, 5]], trace=trace)
        embed = to_numpy(trace["embed"])[0]
        assert np.array_equal(embed[0], embed[2]) and np.array_equal(embed[0], embed[3])
        assert not np.array_equal(embed[0], embed[1])

    def test_tied_logits_equal_final_norm_times_embedding_transposed(self, model):
        trace: dict = {}
        logits = run(model, [[1, 2, 3, 250]], trace=trace)
        table = to_numpy(model.model.embed_tokens.weight[...])  # a torch Parameter or an nnx.Param
        expected = to_numpy(trace["final_norm"]) @ table.T  # F.linear(x, E) == x @ E.T
        assert rel_err(logits, expected) <= 1e-6

    def test_last_only_equals_last_row_of_full_logits(self, model):
        ids = np.array([[3, 1, 4, 1, 5, 9, 2], [6, 5, 3, 5, 8, 9, 7]])
        full = run(model, ids)
        last = run(model, ids, last_only=True)
        assert last.shape == (2, 1, full.shape[-1])
        assert rel_err(last[:, 0], full[:, -1]) <= 1e-6

    def test_left_padding_matches_unpadded_row(self, model):
        ids = np.array([[7, 8, 9, 10, 11]])
        alone = run(model, ids)
        padded = np.array([[0, 0, 7, 8, 9, 10, 11]])
        mask = np.array([[0, 0, 1, 1, 1, 1, 1]])
        together = run(model, padded, attention_mask=mask)
        assert np.isfinite(together).all()
        assert rel_err(together[:, 2:], alone) <= 1e-5

    @pytest.mark.parametrize(
        ("ids", "needle"),
        [
            ([[1, 2, 263]], "input_ids[0, 2] = 263 is outside the vocabulary [0, 263)"),
            ([[1, -1]], "input_ids[0, 1] = -1 is outside"),
            ([[1.5, 2.0]], "integer token ids"),
            ([1, 2, 3], "rank 1"),
            (np.zeros((2, 0), np.int64), "empty"),
            (np.zeros((1, 513), np.int64), "max_position_embeddings=512"),
        ],
    )
    def test_bad_input_is_refused_with_the_value(self, model, ids, needle):
        with pytest.raises(InputError) as err:
            run(model, ids)
        assert needle in str(err.value)

    def test_several_faults_are_named_in_one_order(self, model):
        """The ids, the mask, the positions, then the routing, in both backends: a call with several faults names the
        same one in either (jax_impl once checked the routing before the positions)."""
        routing = {0: np.zeros((1, 3, 2), np.int64)}  # a dense layer takes none
        with pytest.raises(InputError, match=r"positions\[0, 0\] = 512 is outside"):
            run(model, [[1, 2, 3]], positions=np.full((1, 3), 512), routing=routing)
        with pytest.raises(InputError, match="attention_mask has shape"):
            run(model, [[1, 2, 3]], attention_mask=np.ones((1, 2)), positions=np.full((1, 3), 512))

    @pytest.mark.parametrize(
        ("dtype", "loaded"),
        [("bfloat16", "bfloat16"), ("own-bfloat16", "bfloat16"), (np.float16, "float16"), ("bf16", None),
         ("float64", None), (np.float64, None), (None, None), (1, None)],
    )  # fmt: skip
    def test_a_dtype_by_name_or_by_a_frameworks_dtype(self, default_dir, dtype, loaded):
        """A supported dtype by name, as numpy's or as the backend's own framework's object of that name, loads in it;
        anything else (float64, None, an int, which torch took for a device index) is refused by both loaders alike."""
        if dtype == "own-bfloat16":  # torch.bfloat16 or jnp.bfloat16
            dtype = importlib.import_module("torch" if self.backend == "torch" else "jax.numpy").bfloat16
        if loaded is None:
            with pytest.raises(InputError, match=r"is not supported \(choose: float32, bfloat16, float16\)"):
                load(self.backend, default_dir, dtype)
            return
        weight = load(self.backend, default_dir, dtype).model.embed_tokens.weight
        assert str(weight.dtype).removeprefix("torch.") == loaded

    def test_bad_attention_mask_shape(self, model):
        with pytest.raises(InputError, match=r"attention_mask has shape \[1, 3\], expected \[1, 4\]"):
            run(model, [[1, 2, 3, 4]], attention_mask=np.ones((1, 3)))

    def test_runs_without_the_other_framework(self, tmp_path):
        """The backend imports and runs with the other framework absent: dependencies point one way
        (docs/design.md, "Layout and dependency direction")."""
        blocked = set(self.other_framework)
        code = textwrap.dedent(ISOLATED_RUN).format(
            backend=f"{self.backend}_impl", blocked=blocked, cache=str(tmp_path)
        )
        result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, result.stderr[-3000:]
        assert result.stdout.strip().endswith("ok")
