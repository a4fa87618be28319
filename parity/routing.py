"""Routing-aware parity for mixture-of-experts layers (issue 18): which expert choices two frameworks share.

Routing is discontinuous: a rounding-level difference in a router logit can send a token to another expert and
move that token's MLP output by O(1) in two correct implementations. So the selected experts are compared per
choice, not as a tensor, and every disagreement is classified:

- Choices are compared as SETS per token, not slot by slot: experts with equal probabilities inside the selected
  set may be listed in either order (torch.topk on CPU orders tied values arbitrarily, measured: six equal
  values came back as 3, 5, 4, 0), and the block's output is a sum over the set, so the order is not part of the
  semantics. topk_ids and topk_weights are therefore compared sorted by expert id (`canonical`).
- A disagreement pairs an expert only the reference chose (a) with one only the tested run chose (b); its
  margin is the reference's router-logit difference l[a] - l[b]. For a flip two correct runs can produce, a and
  b are the reference's k-th and (k+1)-th experts, and the margin is the k-th/(k+1)-th margin. It is a *near-tie*
  (reported, not a failure) when the margin is within `routing_bound` (parity/tolerances.py, ROUTING_REASON):
  twice the router-logit difference the tolerance table admits between two correct runs at that layer. Any other
  disagreement fails, and is named.
- A near-tie flip changes that token's expert output, and attention carries it to the later positions of its
  row: components downstream of it are compared with those positions masked (`Masks`), and the report says so.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from parity.tolerances import Tolerance, routing_bound

# The components of a sparse layer that depend on its routing (masked on a near-tie flip's token in that layer).
AFTER_ROUTING = ("moe.topk_ids", "moe.topk_weights", "moe.experts_out", "mlp_out", "mlp_post_norm", "x2")


@dataclass(frozen=True)
class Flip:
    """One (token, slot) choice on which the two runs disagree."""

    token: tuple[int, int]  # (batch row, position)
    slot: int  # the reference's slot of the expert the tested run did not choose
    test_expert: int
    ref_expert: int
    margin: float  # reference router logit of ref_expert minus that of test_expert
    bound: float
    near_tie: bool

    def describe(self, layer: int, test: str, ref: str) -> str:
        rel = "<=" if self.near_tie else ">"
        line = (
            f"layer {layer} routing: token {self.token} slot {self.slot}: {test} chose expert {self.test_expert}, "
            f"{ref} expert {self.ref_expert}, margin {abs(self.margin):.2g} {rel} bound {self.bound:.2g}"
        )
        if self.margin < 0:  # the reference's choice disagrees with its own logits: the bug may be on its side
            line += f" (reversed: {ref}'s own router logits rank expert {self.test_expert} higher)"
        return line

    def to_dict(self) -> dict:
        margin = self.margin if np.isfinite(self.margin) else "inf"  # an id outside [0, E): no logit to compare
        return {**self.__dict__, "token": list(self.token), "margin": margin}


@dataclass
class LayerRouting:
    """One sparse layer's routing agreement between two runs."""

    layer: int
    choices: int  # (token, slot) choices compared: k per token not masked by an earlier flip
    agree: int
    bound: float  # the near-tie margin bound at this layer
    near_tie_tokens: int  # tokens whose reference k-th/(k+1)-th margin is within the bound, flipped or not
    masked_tokens: int  # tokens left out: downstream of a near-tie flip in an earlier layer
    flips: list[Flip] = field(default_factory=list)

    @property
    def agreement(self) -> float:
        return self.agree / self.choices if self.choices else 1.0

    @property
    def failures(self) -> list[Flip]:
        return [f for f in self.flips if not f.near_tie]

    @property
    def near_tie_flips(self) -> list[Flip]:
        return [f for f in self.flips if f.near_tie]

    def summary(self) -> str:
        flipped = len({f.token for f in self.near_tie_flips})
        line = (
            f"layer {self.layer}: {self.agreement:.2%} of {self.choices} (token, slot) choices agree; "
            f"{self.near_tie_tokens} near-tie tokens (k-th/(k+1)-th margin <= {self.bound:.2g}), {flipped} flipped"
        )
        if self.failures:
            line += f", {len(self.failures)} failing choices"
        if self.masked_tokens:
            line += f"; {self.masked_tokens} tokens downstream of an earlier near-tie flip left out"
        return line

    def to_dict(self) -> dict:
        return {
            "layer": self.layer,
            "choices": self.choices,
            "agree": self.agree,
            "agreement": self.agreement,
            "bound": self.bound,
            "near_tie_tokens": self.near_tie_tokens,
            "masked_tokens": self.masked_tokens,
            "flips": [f.to_dict() for f in self.flips],
        }


def canonical(ids: np.ndarray, weights: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray | None]:
    """Each token's selected experts (and their weights) sorted by expert id: the set, in a fixed order."""
    order = np.argsort(ids, axis=-1, kind="stable")  # [B, T, k]
    ids = np.take_along_axis(ids, order, axis=-1)
    return ids, None if weights is None else np.take_along_axis(weights, order, axis=-1)


def analyse_layer(
    layer: int,
    test_ids: np.ndarray,
    ref_ids: np.ndarray,
    ref_logits: np.ndarray,
    skip: np.ndarray,
    tolerance: Tolerance,
) -> LayerRouting:
    """Compare the expert sets of `test_ids` and `ref_ids` ([B, T, k]) on the tokens not in `skip` ([B, T])."""
    test_ids, ref_ids = test_ids.astype(np.int64), ref_ids.astype(np.int64)
    k = ref_ids.shape[-1]
    keep = ~skip
    bound = routing_bound(tolerance, layer, float(np.abs(ref_logits[keep]).max(initial=0.0)))
    ranked = -np.sort(-ref_logits, axis=-1)  # [B, T, E] descending
    kth_margin = ranked[..., k - 1] - ranked[..., k] if ref_logits.shape[-1] > k else np.full(skip.shape, np.inf)
    shared = (test_ids[..., :, None] == ref_ids[..., None, :]).any(-1)  # [B, T, k]: test's choice also ref's
    result = LayerRouting(
        layer,
        choices=int(keep.sum()) * k,
        agree=int(shared[keep].sum()),
        bound=bound,
        near_tie_tokens=int((kth_margin[keep] <= bound).sum()),
        masked_tokens=int(skip.sum()),
    )
    for b, t in zip(*np.nonzero(keep & ~shared.all(-1)), strict=True):
        ref_only = [(s, int(e)) for s, e in enumerate(ref_ids[b, t]) if e not in test_ids[b, t]]
        test_only = sorted(int(e) for e in test_ids[b, t] if e not in ref_ids[b, t])
        for (slot, a), e in zip(ref_only, test_only, strict=False):  # strict=False: duplicated ids are a failure too
            margin = float(ref_logits[b, t, a] - ref_logits[b, t, e]) if 0 <= e < ref_logits.shape[-1] else np.inf
            result.flips.append(Flip((int(b), int(t)), slot, e, a, margin, bound, bool(abs(margin) <= bound)))
    return result


@dataclass
class Masks:
    """Which (row, position) entries of each component are left out, downstream of near-tie flips."""

    shape: tuple[int, int]
    flipped: dict[int, np.ndarray] = field(default_factory=dict)  # layer -> [B, T] near-tie flip tokens there
    ahead: dict[int, np.ndarray] = field(default_factory=dict)  # layer -> [B, T] reached by an earlier flip

    def before(self, layer: int) -> np.ndarray:
        """Tokens an earlier layer's near-tie flip reaches (its row, at its position and after: causal attention)."""
        reach = np.zeros(self.shape, dtype=bool)
        for i, tokens in self.flipped.items():
            if i < layer:
                first = np.where(tokens.any(-1), tokens.argmax(-1), self.shape[1])  # [B]
                reach |= np.arange(self.shape[1])[None, :] >= first[:, None]
        return reach

    def add(self, routing: LayerRouting) -> None:
        tokens = np.zeros(self.shape, dtype=bool)
        for f in routing.near_tie_flips:
            tokens[f.token] = True
        if tokens.any():
            self.flipped[routing.layer] = tokens

    def mask(self, name: str, num_layers: int) -> np.ndarray | None:
        """The [B, T] entries of component `name` to leave out (None: none)."""
        if name.startswith("layers."):
            layer, component = int(name.split(".")[1]), name.split(".", 2)[2]
            out = self.before(layer)
            if component in AFTER_ROUTING and layer in self.flipped:
                out = out | self.flipped[layer]
        else:
            out = self.before(num_layers if name != "embed" else 0)
        return out if out.any() else None

    @property
    def any(self) -> bool:
        return bool(self.flipped)


def masked(test: np.ndarray, ref: np.ndarray, mask: np.ndarray | None) -> np.ndarray:
    """`test` with the masked [B, T] entries replaced by the reference's: they then add no difference."""
    if mask is None or test.shape != ref.shape or test.shape[:2] != mask.shape:
        return test
    out = test.copy()
    out[mask] = ref[mask]
    return out
