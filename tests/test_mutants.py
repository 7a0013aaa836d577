"""The mutation pass is only as good as its mutants: each must still apply to this checkout.

`tests/mutants.py` reports a mutant whose snippet is gone as "n/a" (so it can run against older
checkouts); here, at this checkout, a missing snippet, test file or test is an error, so a refactor
cannot quietly retire a mutant. A broken Python file must still compile: a mutant that is a syntax
error fails every test that imports it, which says nothing of what the tests check (one of pass 28's
did, an `if` left without a body).
"""

from pathlib import Path

import pytest

from mutants import MUTANTS

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("mutant", MUTANTS, ids=lambda m: m.name)
def test_every_mutant_applies_here(mutant):
    source = (ROOT / mutant.path).read_text()
    assert mutant.old in source, f"{mutant.path} no longer holds the snippet"
    assert mutant.old != mutant.new
    if mutant.path.endswith(".py"):
        compile(source.replace(mutant.old, mutant.new, 1), mutant.path, "exec")
    for test in mutant.tests:
        file, _, name = test.partition("::")
        assert (ROOT / "tests" / file).is_file(), test
        assert not name or f"def {name.split('[')[0]}(" in (ROOT / "tests" / file).read_text(), test


def test_a_mutant_that_does_not_compile_gets_no_verdict(tmp_path):
    from mutants import Mutant, run

    (tmp_path / "gate.py").write_text("def gate(x):\n    if x:\n        raise ValueError(x)\n    return x\n")
    mutant = Mutant("gate: an if left without a body", "gate.py", "        raise ValueError(x)\n", "", ["test_gate.py"])
    status, seconds, detail = run(mutant, tmp_path, 60)
    assert (status, seconds) == ("invalid", 0.0) and "indented block" in detail
    assert (tmp_path / "gate.py").read_text().count("raise ValueError") == 1  # left as it was
