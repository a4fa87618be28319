"""Whether a shown output block of docs/tutorial.md says the same thing as what its python block printed.

`output_mismatch(shown, printed)` is None when they match, else the first line that does not. The rules (words
exactly, whitespace and column widths ignored, integers exactly, decimals to the digits shown, and a parity
report's measured errors within the bound the report prints beside them; a line `...` skips any number of lines,
`...` inside a line matches any text) are spelled out beside TOKEN below, and tested in test_output_match.py.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# A shown output block matches what its python block printed when, line by line, the two say the same thing.
# Lines are compared as tokens, so whitespace and column widths never count (a table whose column narrowed on
# another machine is the same table). Words and punctuation must be equal. Each number agrees within the
# tolerance that applies to it:
#
# - an integer (no point, no exponent: a count, an id, a shape, a FLOP count) exactly;
# - a decimal to the digits the text shows: within one unit of its last printed digit (a value that sits on
#   a rounding boundary prints one unit apart on another machine), and never by more than 1% of it;
# - a measured error in a table whose header has `<=` columns (the parity report): within the bound the row
#   prints beside it, on both sides. Such an error is float32 rounding noise: its digits depend on the
#   processor and the BLAS library (transformers and torch_impl gave a 1-cos of 0 on one CPU and 1.11e-16 on
#   another), while the tolerance the report states for it, and its verdict, do not. The columns before a
#   `<=` column (back to the previous one) are its group: max_abs, mean_abs and max_rel share max_rel's
#   bound, 1-cos and KL have their own. An error above its bound on either side (a bug's magnitude, as in
#   section 7's FAIL rows) is compared to its digits like any decimal; so are the bounds themselves.
#
# `...` alone on a line skips any number of lines; `...` inside a line matches any tokens.
TOKEN = re.compile(
    r"(?P<number>(?<![\w.])[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?(?![\w.]))"  # not a digit inside a name
    r"|(?P<ellipsis>\.\.\.)|(?P<word>\w+)|(?P<mark>\S)"
)
REL_CAP = 1e-2  # a decimal never agrees to worse than 1%, whatever digits it shows
BOUND = "<="  # a table column of bounds: the columns before it hold the errors it bounds


def tokens(text: str) -> list[tuple[str, str]]:
    """(kind, text) tokens of one line: number, ellipsis, word or a single punctuation mark."""
    return [(m.lastgroup, m.group()) for m in TOKEN.finditer(text)]


def _digit_unit(shown: str) -> float:
    """One unit of the last digit `shown` prints: 0.01 for '1.31', 1e-3 for '1.31e-01', 0 for an integer."""
    mantissa, _, exponent = shown.lower().partition("e")
    if "." not in mantissa and not exponent:
        return 0.0
    decimals = len(mantissa.partition(".")[2])
    return 10.0 ** (int(exponent or 0) - decimals)


def numbers_agree(shown: str, printed: str) -> bool:
    """`printed` agrees with `shown` to the digits `shown` prints (integers exactly), at most 1% apart."""
    x, y = float(shown), float(printed)
    if x == y:
        return True
    tolerance = min(_digit_unit(shown), REL_CAP * abs(x))
    return abs(x - y) <= tolerance * (1 + 1e-9)  # 1e-9: the binary representation of the decimal unit


def _tokens_match(shown: list[tuple[str, str]], printed: list[tuple[str, str]]) -> bool:
    def match(i: int, j: int) -> bool:
        if i == len(shown):
            return j == len(printed)
        kind, text = shown[i]
        if kind == "ellipsis":  # any run of tokens, including none
            return any(match(i + 1, k) for k in range(j, len(printed) + 1))
        if j == len(printed) or printed[j][0] != kind:
            return False
        same = numbers_agree(text, printed[j][1]) if kind == "number" else text == printed[j][1]
        return same and match(i + 1, j + 1)

    return match(0, 0)


@dataclass
class Row:
    """A row of a right-aligned table: its cells by column index, and the table's header fields."""

    cells: dict[int, str]
    header: list[str]

    def bound_of(self, column: int) -> float | None:
        """The bound printed in this row for the error in `column`, or None if the column is not an error."""
        if column == 0 or self.header[column] == BOUND:
            return None
        after = next((k for k in range(column + 1, len(self.header)) if self.header[k] == BOUND), None)
        cell = self.cells.get(after) if after is not None else None
        try:
            return float(cell) if cell is not None else None
        except ValueError:
            return None


def table_rows(lines: list[str]) -> list[Row | None]:
    """Per line: a Row when the line is a row of a table with `<=` columns, else None.

    A table is a header line with a `<=` field, then the lines up to the next blank one. Its first column is
    left-aligned and the others right-aligned (parity/report.py), so a cell is the run of fields that ends
    where a header field ends. A line that cannot be cut that way is compared as plain tokens.
    """
    rows: list[Row | None] = [None] * len(lines)
    header: list[re.Match] | None = None
    for k, line in enumerate(lines):
        fields = list(re.finditer(r"\S+", line))
        if not fields:
            header = None
        elif BOUND in (f.group() for f in fields) and not any(_is_number(f.group()) for f in fields):
            header = fields  # names and `<=`, no number: a header (a row always holds a number)
        elif header is not None:
            rows[k] = _cut(fields, header)
    return rows


def _is_number(text: str) -> bool:
    return [kind for kind, _ in tokens(text)] == ["number"]


def _cut(fields: list[re.Match], header: list[re.Match]) -> Row | None:
    ends = {f.end(): column for column, f in enumerate(header)}
    cells, pending = {0: fields[0].group()}, []
    for field in fields[1:]:
        pending.append(field.group())
        column = ends.get(field.end())
        if column is not None and column > max(cells):
            cells[column], pending = " ".join(pending), []
    return Row(cells, [f.group() for f in header]) if not pending else None


def _rows_match(shown: Row, printed: Row) -> bool:
    if sorted(shown.cells) != sorted(printed.cells) or shown.header != printed.header:
        return False
    for column, text in shown.cells.items():
        other = printed.cells[column]
        bounds = shown.bound_of(column), printed.bound_of(column)
        if None not in bounds and _within(text, bounds[0]) and _within(other, bounds[1]):
            continue  # both readings of a measured error are inside the tolerance the report states for it
        if not _tokens_match(tokens(text), tokens(other)):
            return False
    return True


def _within(cell: str, bound: float) -> bool:
    try:
        return abs(float(cell)) <= bound
    except ValueError:  # "-" (a non-finite metric) or a word
        return False


def _line_matches(shown: str, printed: str, shown_row: Row | None, printed_row: Row | None) -> bool:
    if shown_row is not None and printed_row is not None and "..." not in shown:
        return _rows_match(shown_row, printed_row)
    return _tokens_match(tokens(shown), tokens(printed))


def output_mismatch(expected: str, actual: str) -> str | None:
    """None when `actual` matches the shown `expected` output, else the first line that does not."""
    exp, act = expected.rstrip("\n").splitlines(), actual.rstrip("\n").splitlines()
    exp_rows, act_rows = table_rows(exp), table_rows(act)

    def line(i: int, j: int) -> bool:
        return _line_matches(exp[i], act[j], exp_rows[i], act_rows[j])

    def match(i: int, j: int) -> bool:  # exp[i:] against act[j:]; "..." lines skip any number of lines
        if i == len(exp):
            return j == len(act)
        if exp[i].strip() == "...":
            return any(match(i + 1, jj) for jj in range(j, len(act) + 1))
        return j < len(act) and line(i, j) and match(i + 1, j + 1)

    if match(0, 0):
        return None
    for i, text in enumerate(exp):
        if text.strip() == "..." or i >= len(act) or not line(i, i):
            got = act[i] if i < len(act) else "<end of output>"
            return f"shown line {i + 1}: {text!r}\n  printed:      {got!r}"
    return f"the block printed {len(act) - len(exp)} more line(s), from {act[len(exp)]!r}"
