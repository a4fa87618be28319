"""Generation both backends must share: cached logits equal uncached ones, ragged batches equal rows run
alone, seeds reproduce, EOS stops, bad requests are refused with the value.

One body for both twins: tests/torch_impl/test_generate.py and tests/jax_impl/test_generate.py subclass
`GenerateTwin` with their backend's name; pytest collects the subclasses, never this module. Greedy tokens
across the two backends and transformers are compared in tests/parity/test_hf_reference.py.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
import pytest

from spec import InputError
from tests.backends import load, package, rel_err, run
from tests.greedy import assert_same_greedy

FP32_REL = 1e-5  # the float32 tolerance of the decoder (see tests/parity/test_hf_reference.py)


class GenerateTwin:
    backend: ClassVar[str]  # "torch" | "jax"

    @pytest.fixture(scope="class")
    def model(self, default_dir):
        return load(self.backend, default_dir)

    def generate(self, model: Any, ids: Any, n: int, **kwargs: Any) -> Any:
        return package(self.backend).generate(model, ids, n, **kwargs)

    @pytest.mark.parametrize(
        "prompt",
        [
            [[5, 9, 200, 17, 33, 101, 7], [1, 2, 3, 4, 5, 6, 7]],
            [[5]],  # a one-token prompt: its prefill has a decode step's shapes, but an empty cache
            [[5], [9]],
        ],
        ids=["seven-tokens", "one-token", "two-rows-of-one-token"],
    )
    def test_cached_logits_equal_recomputed_logits(self, model, prompt):
        prompt = np.array(prompt)
        out = self.generate(model, prompt, 12, eos_token_ids=(), return_logits=True)
        full = np.concatenate([prompt, np.array(out.tokens)], axis=1)
        recomputed = run(model, full)  # [B, T + 12, V], no cache
        for step, logits in enumerate(out.logits):
            assert rel_err(logits, recomputed[:, prompt.shape[1] - 1 + step]) <= FP32_REL, step

    def test_ragged_batch_rows_equal_rows_alone(self, model):
        prompts = [[5, 9, 200, 17, 33], [7, 8], [100, 101, 102]]
        together = self.generate(model, prompts, 10, eos_token_ids=(), return_logits=True)
        alone = [self.generate(model, [p], 10, eos_token_ids=()).tokens[0] for p in prompts]
        # A row alone runs [1, H] products, in the batch [3, H] ones: another summation order, so the tokens
        # match except after a near-tie (tests/greedy.py).
        assert_same_greedy({"together": together.tokens, "alone": alone}, together.logits)

    def test_same_seed_same_tokens(self, model):
        kw = dict(temperature=0.9, top_k=40, top_p=0.9, eos_token_ids=())
        first = self.generate(model, [[3, 4, 5]], 16, seed=7, **kw).tokens
        assert first == self.generate(model, [[3, 4, 5]], 16, seed=7, **kw).tokens
        assert first != self.generate(model, [[3, 4, 5]], 16, seed=8, **kw).tokens

    def test_each_step_draws_afresh(self, model):
        # At this temperature the distribution is flat to ~1e-6: a step drawing with the previous step's randomness
        # would pick the previous step's token again, every step.
        tokens = self.generate(model, [[3, 4, 5]], 8, temperature=1e6, seed=3, eos_token_ids=()).tokens[0]
        assert len(set(tokens)) > 4, tokens

    def test_one_eos_id_as_an_int_or_a_numpy_integer(self, model):
        free = self.generate(model, [[5, 9, 200]], 20, eos_token_ids=()).tokens[0]
        stop = free[5]
        cut = free[: free.index(stop) + 1]
        assert self.generate(model, [[5, 9, 200]], 20, eos_token_ids=stop).tokens[0] == cut  # as transformers takes it
        assert self.generate(model, [[5, 9, 200]], 20, eos_token_ids=np.array([stop])).tokens[0] == cut

    def test_ragged_rows_as_arrays_or_ranges_are_padded_like_lists(self, model):
        lists = self.generate(model, [[5, 9, 200], [7]], 6, eos_token_ids=()).tokens
        assert self.generate(model, [np.array([5, 9, 200]), np.array([7])], 6, eos_token_ids=()).tokens == lists
        assert (
            self.generate(model, (range(5, 8), range(7, 8)), 6, eos_token_ids=()).tokens
            == self.generate(model, [[5, 6, 7], [7]], 6, eos_token_ids=()).tokens
        )

    @pytest.mark.parametrize(("prompt_len", "new"), [(512, 1), (511, 2)])
    def test_generation_may_fill_every_position(self, model, prompt_len, new):
        """The last new token is never fed back: prompt + new - 1 positions, all of max_position_embeddings (512)."""
        assert model.spec.max_position_embeddings == 512
        prompt = np.random.default_rng(2).integers(1, 263, (1, prompt_len))
        out = self.generate(model, prompt, new, eos_token_ids=(), return_logits=True)
        full = np.concatenate([prompt, np.array(out.tokens)[:, :-1]], axis=1)  # [1, 512]: every token the model ran
        recomputed = run(model, full)
        for step, logits in enumerate(out.logits):
            assert rel_err(logits, recomputed[:, prompt_len - 1 + step]) <= FP32_REL, step

    def test_top_k_one_is_greedy(self, model):
        greedy = self.generate(model, [[3, 4, 5]], 8, eos_token_ids=()).tokens
        assert self.generate(model, [[3, 4, 5]], 8, temperature=1.5, top_k=1, eos_token_ids=()).tokens == greedy

    def test_stops_at_eos(self, model):
        free = self.generate(model, [[5, 9, 200]], 20, eos_token_ids=()).tokens[0]
        stop = free[5]
        cut = self.generate(model, [[5, 9, 200]], 20, eos_token_ids=(stop,)).tokens[0]
        assert cut == free[: free.index(stop) + 1]
        assert model.eos_token_ids == (256,)  # read from the checkpoint's generation_config.json

    @pytest.mark.parametrize(
        ("kwargs", "needle"),
        [
            (dict(max_new_tokens=0), "max_new_tokens must be an integer >= 1, got 0"),
            (dict(max_new_tokens=600), "3 + max_new_tokens 600 - 1 = 602 positions exceed the model's max_position"),
            (dict(ids=[[1] * 512], max_new_tokens=2), "= 513 positions exceed the model's max_position_embeddings=512"),
            (dict(top_p=0.0), "top_p must lie in (0, 1], got 0.0"),
            (dict(top_p=1.5), "top_p must lie in (0, 1], got 1.5"),
            (dict(temperature=-1.0), "temperature must be >= 0"),
            (dict(ids=[[]]), "prompt 0 is empty"),
            (dict(ids=[[1, 2, 999]]), "is outside the vocabulary"),
            (dict(temperature=1e-45), "below float32's smallest normal number"),
            (dict(eos_token_ids=(1.5,)), "must hold integer token ids, got 1.5"),
            (dict(eos_token_ids=(-1,)), "eos_token_ids: -1 is outside the vocabulary [0, 263)"),
            (dict(eos_token_ids=263), "eos_token_ids: 263 is outside the vocabulary [0, 263)"),
            (dict(eos_token_ids=(2**40,)), f"eos_token_ids: {2**40} is outside the vocabulary"),
            (dict(eos_token_ids="7"), "must be a token id or a sequence of them"),
            (dict(ids=[], eos_token_ids=263), "input_ids is empty"),  # the prompts before the EOS ids, in both
            (dict(ids=[[1, 2, 999]], top_k=0), "top_k must be a positive integer"),  # the sampling before the prompts
        ],
    )
    def test_bad_requests(self, model, kwargs, needle):
        kwargs = dict(kwargs)  # parametrize shares the dict between the two backends
        ids = kwargs.pop("ids", [[1, 2, 3]])
        n = kwargs.pop("max_new_tokens", 4)
        with pytest.raises(InputError) as err:
            self.generate(model, ids, n, **kwargs)
        assert needle in str(err.value)
