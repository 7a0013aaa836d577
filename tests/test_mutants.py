"""The mutation pass is only as good as its mutants: each must still apply to this checkout.

`tests/mutants.py` reports a mutant whose snippet is gone as "n/a" (so it can run against older
checkouts); here, at this checkout, a missing snippet, test file or test is an error, so a refactor
cannot quietly retire a mutant.
"""

from pathlib import Path

import pytest

from mutants import MUTANTS

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("mutant", MUTANTS, ids=lambda m: m.name)
def test_every_mutant_applies_here(mutant):
    assert mutant.old in (ROOT / mutant.path).read_text(), f"{mutant.path} no longer holds the snippet"
    assert mutant.old != mutant.new
    for test in mutant.tests:
        file, _, name = test.partition("::")
        assert (ROOT / "tests" / file).is_file(), test
        assert not name or f"def {name.split('[')[0]}(" in (ROOT / "tests" / file).read_text(), test
