"""Everything docs/tutorial.md names exists (tutorial_references.py finds the names and holds the rules).

- Every `path/file.py::Symbol.attr` resolves and every bare path in backticks exists.
- Mapping tables put each framework's code in its own column.
- Checkpoint tensor names (`model.layers.{i}.mlp.gate_proj.weight`, ...) must be rows of spec.param_table for
  the default spec (a few, listed in VARIANT_ONLY, for the untied / q-k-v-bias variant of it) or for one of the
  family and MoE checkpoints of tests/hf_models.py (sections 10 to 15); parity component names
  (`layers.{i}.mlp.act`, `final_norm`, ...) must be components some family records (parity.forward_order).
"""

from __future__ import annotations

import dataclasses

from tests.docs.tutorial_blocks import REPO, TUTORIAL
from tests.docs.tutorial_references import (
    BARE_PATH,
    COMPONENT,
    REFERENCE,
    TENSOR_NAME,
    mapping_table_problems,
    resolve_reference,
)

# Checkpoint tensor names that only exist in a variant of the default spec (untied head, q/k/v bias).
VARIANT_ONLY = {
    "lm_head.weight",
    "model.layers.{i}.self_attn.q_proj.bias",
    "model.layers.{i}.self_attn.k_proj.bias",
    "model.layers.{i}.self_attn.v_proj.bias",
}


def test_every_referenced_file_and_symbol_exists():
    text = TUTORIAL.read_text()
    references = sorted(set(REFERENCE.findall(text)))
    assert len(references) >= 40, "the mapping tables name too few symbols: did the reference syntax change?"
    problems = [p for p in (resolve_reference(path, symbol) for path, symbol in references) if p]
    paths = set(BARE_PATH.findall(text))
    problems += [f"{p}: no such file or directory" for p in sorted(paths) if not (REPO / p).exists()]
    assert not problems, "\n".join(problems)


def test_mapping_tables_put_code_in_the_right_columns():
    text = TUTORIAL.read_text()
    assert text.count("| formula | torch_impl | jax_impl | kernel | checkpoint tensor |") >= 6
    problems = mapping_table_problems(text)
    assert not problems, "\n".join(problems)


def _family_specs() -> dict:
    """The specs of tests/hf_models.py's family and MoE checkpoints (sections 10 to 15 name their tensors)."""
    import spec
    from tests.hf_configs import FAMILY_CONFIGS, MOE_CONFIGS
    from tests.hf_models import build_hf_model

    names = [*FAMILY_CONFIGS, *MOE_CONFIGS]
    return {name: spec.ModelSpec.from_hf_config(build_hf_model(name).config.to_dict()) for name in names}


def test_checkpoint_tensor_names_are_in_the_parameter_table():
    import spec

    default = spec.DEFAULT_SPEC
    variant = dataclasses.replace(default, tie_word_embeddings=False, attention_bias=True)

    def names(model_spec) -> set[str]:
        return {e.name for e in spec.param_table(model_spec)}

    def expand(name: str) -> set[str]:
        return {name.replace("{i}", str(i)) for i in range(2)}  # every test spec here has >= 2 layers

    families = set().union(*(names(s) for s in _family_specs().values()))
    used = set(TENSOR_NAME.findall(TUTORIAL.read_text()))
    assert "model.embed_tokens.weight" in used and "model.layers.{i}.mlp.gate_proj.weight" in used
    problems = []
    for name in sorted(used):
        # A name the default spec (or its untied/bias variant) lacks must be a family checkpoint's.
        table = (names(variant) if name in VARIANT_ONLY else names(default)) | families
        if not expand(name) <= table:
            problems.append(f"{name!r} is not in spec.param_table of the default spec, its variant, or a family's")
    assert not problems, "\n".join(problems)


def test_parity_component_names_exist():
    from parity.components import forward_order

    order = set(forward_order(2))  # every component any family's layers record
    used = set(COMPONENT.findall(TUTORIAL.read_text()))
    assert {"embed", "logits", "layers.{i}.x1", "layers.{i}.attn_post_norm"} <= used
    unknown = sorted(n for n in used if not {n.replace("{i}", str(i)) for i in range(2)} <= order)
    assert not unknown, f"not parity components: {unknown}"
