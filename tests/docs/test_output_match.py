"""The output matching rules of output_match.py (`output_mismatch`), on made-up outputs: numbers outside
tables, words and whitespace, `...`, and a parity report's table as another machine might print it."""

from __future__ import annotations

from tests.docs.output_match import output_mismatch

TABLE = """\
torch vs hf (float32)
component    max_abs  mean_abs  max_rel        <=     1-cos        <=  KL        <=   top1  verdict
embed              0         0        0  1.00e-05         0  5.00e-11                            ok
final_norm         0         0        0  1.73e-05  1.11e-16  1.50e-10                            ok
logits             0         0        0  1.73e-05  1.11e-16  1.50e-10   0  2.90e-12  1.000       ok
"""


def _printed(table: str, replace: dict[str, str], at: dict[tuple[int, int], str] | None = None) -> str:
    """`table` as another machine might print it: some cells replaced, the columns re-aligned to fit.

    `replace` maps a cell's text to a new one wherever it occurs; `at` sets the cell at (data row, column).
    Alignment as parity/report.py's: the first column left-aligned, the others right-aligned.
    """
    lines = table.splitlines()
    rows = [lines[1].split()] + [line.split() for line in lines[2:]]
    for r, row in enumerate(rows[1:]):
        row[:] = [replace.get(cell, cell) for cell in row]
        if len(row) < len(rows[0]):  # the empty KL, KL bound and top1 cells of a non-logits row
            row[-1:-1] = [""] * (len(rows[0]) - len(row))
        for (at_row, column), text in (at or {}).items():
            if at_row == r:
                row[column] = text
    widths = [max(len(row[k]) for row in rows) for k in range(len(rows[0]))]
    aligned = [
        "  ".join(c.ljust(w) if k == 0 else c.rjust(w) for k, (c, w) in enumerate(zip(row, widths, strict=True)))
        for row in rows
    ]
    return "\n".join([lines[0], *aligned]) + "\n"


def test_output_matching_rules():
    # Numbers outside tables: integers exactly, decimals to one unit of their last digit (at most 1%).
    assert output_mismatch("a 1.00e-05 b\n", "a 1.00e-05 b\n") is None
    assert output_mismatch("max_rel 1.31e-01", "max_rel 1.32e-01") is None  # a rounding boundary: one unit
    assert output_mismatch("max_rel 1.31e-01", "max_rel 1.33e-01") is not None
    assert output_mismatch("max_rel 1.31e-01", "max_rel 2.00e-01") is not None  # a wrong number fails
    assert output_mismatch("RMS 1.0000, mean 0.9899", "RMS 0.9999, mean 0.9899") is None
    assert output_mismatch("RMS 1.0000, mean 0.9899", "RMS 1.0000, mean 0.9897") is not None
    assert output_mismatch("[-3.0, 1.0]", "[-3.0, 1.1]") is not None  # 1%, though 1.0 shows one decimal
    assert output_mismatch("[-3.0, 1.0]", "[3.0, 1.0]") is not None  # the sign is part of the number
    assert output_mismatch("torch 384, jax 384", "torch 384, jax 385") is not None  # integers exactly
    assert output_mismatch("FLOPs 9,663,676,416", "FLOPs 9,663,676,417") is not None
    assert output_mismatch("1-cos 1.11e-16", "1-cos 0") is not None  # outside a table no bound is stated
    # Words, punctuation and digits inside names exactly; whitespace never counts.
    assert output_mismatch("PASS", "FAIL") is not None
    assert output_mismatch("layers.0.x1 ok", "layers.1.x1 ok") is not None
    assert output_mismatch("[[0.8485 1.1314]]", "[[ 0.8485  1.1314]]") is None
    assert output_mismatch("a  b", "a b") is None and output_mismatch("ab", "a b") is not None
    assert output_mismatch("1 2", "12") is not None
    # `...` lines skip lines, `...` in a line skips tokens; line counts must agree.
    assert output_mismatch("head\n...\ntail", "head\nx\ny\ntail") is None
    assert output_mismatch("check: ...", "check: /tmp/abc") is None
    assert output_mismatch("a\nb", "a") is not None and output_mismatch("a", "a\nb") is not None


def test_table_errors_agree_within_their_stated_bounds():
    assert output_mismatch(TABLE, TABLE) is None
    # Another machine: the exact 0 reads 1e-16 and vice versa, the columns narrow or widen: the same result.
    assert output_mismatch(TABLE, _printed(TABLE, {"1.11e-16": "0"})) is None
    noise = _printed(TABLE, {"1.11e-16": "2.22e-15"}, at={(0, 1): "2.38e-07", (2, 7): "7.73e-16"})
    assert output_mismatch(TABLE, noise) is None  # max_abs 2.38e-07 <= 1.00e-05 (max_rel's), KL <= 2.90e-12
    assert output_mismatch(TABLE, _printed(TABLE, {}, at={(0, 1): "3.00e-05"})) is not None  # max_abs > 1e-5
    assert output_mismatch(TABLE, _printed(TABLE, {}, at={(2, 7): "5.00e-12"})) is not None  # KL > 2.90e-12
    # An error outside its bound on either side is a different result, even where the verdict was not edited.
    assert output_mismatch(TABLE, _printed(TABLE, {"1.11e-16": "2.00e-10"})) is not None  # 1-cos > 1.50e-10
    assert output_mismatch(TABLE, _printed(TABLE, {"1.11e-16": "3.00e-03"})) is not None
    # The bounds themselves, top1 and the verdict are compared like any other number or word.
    assert output_mismatch(TABLE, _printed(TABLE, {"1.50e-10": "1.50e-08"})) is not None
    assert output_mismatch(TABLE, _printed(TABLE, {"2.90e-12": "2.90e-10"})) is not None
    assert output_mismatch(TABLE, _printed(TABLE, {"1.000": "0.875"})) is not None
    assert output_mismatch(TABLE, _printed(TABLE, {"ok": "FAIL"})) is not None
    # Errors above their bound (a bug's magnitude) agree only to their digits.
    fail = TABLE.replace("1.11e-16  1.50e-10", "1.02e+00  1.50e-10", 1)
    assert output_mismatch(fail, _printed(fail, {"1.02e+00": "1.03e+00"})) is None
    assert output_mismatch(fail, _printed(fail, {"1.02e+00": "1.10e+00"})) is not None
    assert output_mismatch(fail, _printed(fail, {"1.02e+00": "0"})) is not None
