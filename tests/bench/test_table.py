import random

from fullgraph.bench.table import format_table


def test_columns_align_and_numbers_right_align():
    rows = [[f"case{'x' * random.randint(0, 9)}", random.uniform(0, 1000)] for _ in range(4)]
    lines = format_table(["case", "ms"], rows).splitlines()
    assert len(lines) == 6 and set(lines[1].replace(" ", "")) == {"-"}
    ends = {len(line) for line in lines}
    assert len(ends) == 1  # numbers are right-aligned, so every line ends at the same column
    assert lines[2].startswith(rows[0][0])
