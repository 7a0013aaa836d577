import json
from pathlib import Path

import pytest

from agentrl.cli import main

DEMO = Path(__file__).parent.parent / "recipes" / "demo.yaml"


@pytest.mark.slow
@pytest.mark.timeout(3600)  # the demo end to end, past the suite's per-test limit
def test_demo_rl_raises_success_over_sft(tmp_path):
    """The demo recipe, seeded, end to end (about 9 minutes on 2 idle cores): SFT learns the task and
    GRPO then raises in-domain success further."""
    run = tmp_path / "demo"
    assert main(["run", str(DEMO), "--set", f"run_dir={run}", "--set", f"model.path={run}/model-init"]) == 0
    phases = json.loads((run / "summary.json").read_text())["phases"]
    assert all(r["success"] == 0 for r in phases["initial"].values())
    assert phases["sft"]["l0"]["success"] >= 0.3
    gain = sum(phases["rl"][s]["success"] - phases["sft"][s]["success"] for s in ("l0", "l1")) / 2
    assert gain >= 0.05, phases
