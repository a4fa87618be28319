"""What a pin decides for a dense layer's one-call decode step, the rule torch_impl/layer_choice.py and
jax_impl/layer_choice.py share (framework-neutral): products pinned to another path than the kernel keep the
layer's operators, which run that path; products pinned to the kernel take the call, which computes exactly those
products; a pin of the layer's own choice is taken as it is. Otherwise (None) the layer's own choice decides: timed
in torch_impl, a rule in jax_impl.
"""

from __future__ import annotations

from spec.path_choice import PathChoice

KERNEL = "gemv"  # the products' path the one call computes with


def pinned_one_call(products: PathChoice, layers: PathChoice) -> bool | None:
    """Whether the layer runs in one call as the pins in this thread decide (`products`: the backend's products'
    choice; `layers`: its layers' choice between "one_call" and "operators"); None where nothing is pinned."""
    product, layer = products.forced_path(), layers.forced_path()
    if product is not None and product != KERNEL:
        return False
    if layer is not None or product is not None:
        return layer != "operators"
    return None
