"""Trajectory records: what `agentrl compare` and the analysis commands read back is what was played."""

import dataclasses
import json

import pytest

from agentrl.rollout.records import STEP_FIELDS, read_trajectories, write_trajectories
from agentrl.rollout.types import StepSample, Trajectory


def episode(task_id: str, **fields) -> Trajectory:
    """Every recorded field away from its default (token ids are not recorded)."""
    steps = [StepSample([], [], [], response=f"<action>go {i}</action>", action=f"go {i}" if i else None,
                        observation=f"room {i}", anchor=f"state {i}", reward=1.5 * i, penalty=0.25 + i,
                        prompt=f"prompt {i}", progress=[True, False, None][i], advantage=-0.5 + i, rejected=i)
             for i in range(3)]
    return Trajectory(task_id, 7, "heat", steps, **fields)


@pytest.mark.parametrize("name", ["trajectories_l0.jsonl", "step_000003.jsonl.gz"])
def test_every_recorded_field_reads_back_as_written(tmp_path, name):
    written = [episode("l0-0", success=True, version=3), episode("l0-1", aborted=True, context_ended=True)]
    write_trajectories(tmp_path / name, written)
    read = read_trajectories(tmp_path / name)
    for before, after in zip(written, read, strict=True):
        for f in ("task_id", "group_id", "task_type", "success", "aborted", "version", "context_ended"):
            assert getattr(after, f) == getattr(before, f), f
        for s, r in zip(before.steps, after.steps, strict=True):
            assert {k: getattr(r, k) for k in STEP_FIELDS} == {k: getattr(s, k) for k in STEP_FIELDS}
    assert {f.name for f in dataclasses.fields(StepSample)} - set(STEP_FIELDS) == \
        {"prompt_ids", "response_ids", "logprobs", "value"}  # what a record leaves out, on purpose


def test_a_failed_write_leaves_the_earlier_file_whole(tmp_path):
    path = tmp_path / "trajectories_l0.jsonl"
    write_trajectories(path, [episode("l0-0")])
    before = path.read_text()
    broken = episode("l0-1")
    broken.steps[1].reward = object()  # not JSON: the write fails on the second episode
    with pytest.raises(TypeError):
        write_trajectories(path, [episode("l0-2"), broken])
    assert path.read_text() == before and json.loads(before)["task_id"] == "l0-0"


def test_a_line_that_is_not_a_record_is_named(tmp_path):
    path = tmp_path / "trajectories_l0.jsonl"
    write_trajectories(path, [episode("l0-0")])
    path.write_text(path.read_text() + '{"task_id": "x"}\n')
    with pytest.raises(ValueError, match=r"trajectories_l0.jsonl:2: not a trajectory record"):
        read_trajectories(path)


def test_a_repeated_action_is_a_move_played_again_right_after_itself():
    """`repeated_actions` (the rollout's and evaluation's repeated_rate): a valid move equal to the
    step before's; two responses in a row without an action repeat nothing."""
    actions = ["go to desk 1", "go to desk 1", None, None, "look", "go to desk 1", "look", "look", "look"]
    steps = [StepSample([], [], [], response="", action=a, observation="", anchor="") for a in actions]
    assert Trajectory("t", 0, "pick", steps).repeated_actions == 3
