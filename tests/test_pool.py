import pytest

from agentrl.config import EnvPoolConfig
from agentrl.envs.household.env import HouseholdEnvConfig
from agentrl.envs.pool import EnvPool


def play(pool):
    tasks = {slot: f"train-{slot % 3}" for slot in range(6)}
    observations = pool.reset(tasks)
    transcript = [observations[s].text for s in sorted(observations)]
    for _ in range(3):
        actions = {s: observations[s].admissible_actions[0] for s in observations}
        results = pool.step(actions)
        observations = {s: r.observation for s, r in results.items()}
        transcript += [observations[s].text for s in sorted(observations)]
    return transcript


def test_worker_processes_match_in_process():
    with EnvPool(HouseholdEnvConfig(), EnvPoolConfig(workers=0)) as local:
        expected = play(local)
    with EnvPool(HouseholdEnvConfig(), EnvPoolConfig(workers=2)) as pool:
        assert play(pool) == expected
        procs = list(pool.transport.procs)
    assert all(not p.is_alive() for p in procs)


def test_a_worker_whose_trainer_is_gone_leaves_quietly():
    """The trainer killed (no close said) while a worker computes its answer: the answer finds no
    one to read it; the worker closes its environments and exits 0, no traceback."""
    from agentrl.envs.latency import LatencyEnvConfig
    from agentrl.envs.pool import ProcessWorkers

    workers = ProcessWorkers(LatencyEnvConfig(reset_median_s=0.5, step_median_s=0.0, step_sigma=0.0), 1)
    assert workers.send(0, ("reset", {0: "train-0"}))
    workers.conns[0].close()  # the trainer's end, gone before the answer
    workers.procs[0].join(timeout=120)
    assert workers.procs[0].exitcode == 0


def test_the_time_limit_is_per_environment_of_a_worker():
    """A worker runs its environments one after another: 4 resets of 1 s each (4 s, plus the
    worker's start) are within a 3 s limit per reset; one that hangs is not (the worker is
    replaced, its episodes aborted)."""
    from agentrl.envs.latency import LatencyEnvConfig

    slow = LatencyEnvConfig(reset_median_s=1.0, step_median_s=0.0, step_sigma=0.0)
    with EnvPool(slow, EnvPoolConfig(workers=1, reset_timeout_s=3.0)) as pool:
        observations = pool.reset({slot: f"train-{slot}" for slot in range(4)})
        assert all(o is not None for o in observations.values()) and not pool.faults
    hung = LatencyEnvConfig(reset_median_s=2.0, step_median_s=0.0, step_sigma=0.0)
    with EnvPool(hung, EnvPoolConfig(workers=1, reset_timeout_s=0.6)) as pool:
        assert pool.reset({0: "train-0"}) == {0: None}
        assert pool.faults == ["worker 0 did not answer a reset of 1 environment(s) within the time limit "
                               "(rl.env_pool.reset_timeout_s = 0.6 each)"]



def test_each_queued_message_is_timed_from_when_its_worker_begins_it():
    """Async rollouts queue several messages on one worker: each gets its own limit (one per
    environment it holds), counted from the answer before it, not from when it was sent, and a
    hung message is judged by its own limit, not by that of a larger one queued behind it."""
    import time

    from agentrl.envs.latency import LatencyEnvConfig

    def play(pool, messages):
        observations = pool.reset({slot: f"train-{slot % 3}" for message in messages for slot in message})
        start = time.monotonic()
        for message in messages:
            pool.submit("step", {slot: observations[slot].admissible_actions[0] for slot in message})
        answers = {}
        while pool.pending:
            answers.update(pool.receive())
        return answers, time.monotonic() - start

    one_second = LatencyEnvConfig(step_median_s=1.0, step_sigma=0.0)
    with EnvPool(one_second, EnvPoolConfig(workers=1, step_timeout_s=2.0)) as pool:
        answers, _ = play(pool, [[0], [1], [2]])  # 3 s queued at once, 1 s each
        assert all(answers.values()) and len(answers) == 3 and not pool.faults
    hung = LatencyEnvConfig(step_median_s=10.0, step_sigma=0.0)
    with EnvPool(hung, EnvPoolConfig(workers=1, step_timeout_s=0.5)) as pool:
        answers, seconds = play(pool, [[0], [1, 2, 3, 4, 5]])  # 0.5 s for the first, 2.5 s for the second
        assert answers == {slot: None for slot in range(6)} and seconds < 2.0
        assert pool.faults == ["worker 0 did not answer a step of 1 environment(s) within the time limit "
                               "(rl.env_pool.step_timeout_s = 0.5 each)"]


def test_receive_with_a_timeout_returns_at_it_while_a_worker_is_within_its_limit():
    """Async rollouts poll the pool (`receive(timeout)`) between generations: the call returns at its
    own timeout, empty, while a slow worker is still within its time limit, and does not wait for
    that worker's answer or deadline."""
    import time

    from agentrl.envs.latency import LatencyEnvConfig

    slow = LatencyEnvConfig(step_median_s=3.0, step_sigma=0.0)
    with EnvPool(slow, EnvPoolConfig(workers=1, step_timeout_s=10.0)) as pool:
        observations = pool.reset({0: "train-0"})
        pool.submit("step", {0: observations[0].admissible_actions[0]})
        start = time.monotonic()
        assert pool.receive(0.3) == {} and time.monotonic() - start < 2.0
        assert pool.receive()[0] is not None and not pool.faults


def test_an_answer_already_arrived_is_returned_by_a_poll_that_does_not_wait():
    """`receive(0)` returns what has arrived even though its wait is over as it reads it (async
    rollouts poll with short timeouts: an answer held back to the next poll delays its episode)."""
    with EnvPool(HouseholdEnvConfig(), EnvPoolConfig(workers=1)) as pool:
        pool.submit("reset", {0: "train-0", 1: "train-1"})
        assert pool.transport.wait([0], 120) == [0]  # the answer is in the pipe, not yet read
        answers = pool.receive(0)
        assert set(answers) == {0, 1} and all(o is not None for o in answers.values())
        assert pool.pending == 0


def test_a_message_sent_later_does_not_extend_the_one_in_flight():
    """Async rollouts keep sending a worker moves while an earlier one hangs: the hung one times out
    by its own clock, from when the worker began it, however many are sent after it."""
    import time

    from agentrl.envs.latency import LatencyEnvConfig

    hung = LatencyEnvConfig(step_median_s=10.0, step_sigma=0.0)
    with EnvPool(hung, EnvPoolConfig(workers=1, step_timeout_s=1.0)) as pool:
        observations = pool.reset({slot: f"train-{slot % 3}" for slot in range(10)})
        start = time.monotonic()
        pool.submit("step", {0: observations[0].admissible_actions[0]})
        answers = {}
        for slot in range(1, 10):  # one more move every 0.4 s for 3.6 s, unless the first has timed out
            answers.update(pool.receive(0.4))
            if 0 in answers:
                break
            pool.submit("step", {slot: observations[slot].admissible_actions[0]})
        while 0 not in answers:
            answers.update(pool.receive())
        assert answers[0] is None and time.monotonic() - start < 2.5
        assert pool.faults[0].startswith("worker 0 did not answer a step of 1 environment(s)")

@pytest.mark.parametrize("command", ["try", "expert"])
def test_a_tried_move_or_expert_question_is_timed_and_named_by_the_step_limit(command):
    """`sampling.retries` tries moves (`try`), DAgger asks the expert (`expert`): a hung one times
    out by rl.env_pool.step_timeout_s, the setting its fault names, not by the far longer reset limit."""
    import time

    from agentrl.envs.latency import LatencyEnvConfig

    hung = LatencyEnvConfig(step_median_s=10.0, step_sigma=0.0) if command == "try" else \
        LatencyEnvConfig(step_median_s=0.0, step_sigma=0.0, expert_median_s=10.0)
    with EnvPool(hung, EnvPoolConfig(workers=1, step_timeout_s=0.5, reset_timeout_s=30.0)) as pool:
        observations = pool.reset({0: "train-0"})
        start = time.monotonic()
        ask = pool.expert([0]) if command == "expert" else \
            pool.step({0: observations[0].admissible_actions[0]}, tentative=frozenset({0}))
        assert ask == {0: None} and time.monotonic() - start < 5.0
        assert pool.faults == [f"worker 0 did not answer a{'n' * (command == 'expert')} {command} of 1 environment(s) "
                               "within the time limit (rl.env_pool.step_timeout_s = 0.5 each)"]


def test_a_worker_dead_with_a_message_in_flight_fails_that_and_the_next_at_once():
    """A worker that dies while busy, sent one more message: both its episodes are aborted at once
    (its pipe is closed), not the new one alone with the first left to wait out the time limit."""
    import time

    from agentrl.envs.latency import LatencyEnvConfig

    env = LatencyEnvConfig(inner={"type": "household"}, step_median_s=0.5, step_sigma=0.0)
    with EnvPool(env, EnvPoolConfig(workers=1, step_timeout_s=30.0)) as pool:
        observations = pool.reset({slot: f"train-{slot}" for slot in range(2)})
        pool.submit("step", {0: observations[0].admissible_actions[0]})
        victim = pool.transport.procs[0]
        victim.kill()
        victim.join()
        start = time.monotonic()
        pool.submit("step", {1: observations[1].admissible_actions[0]})
        answers = {}
        while pool.pending:
            answers.update(pool.receive())
        assert answers == {0: None, 1: None} and time.monotonic() - start < 10.0
        assert len(pool.faults) == 1 and "exited during a step" in pool.faults[0]


# --- faults: real worker processes, killed or frozen with real signals --------------------------
import os
import signal
import time
from pathlib import Path

import pytest
from conftest import java_processes
from test_trainer import small_config

from agentrl.envs.pool import WorkerEnvError
from agentrl.trainer import RLTrainer


class SignalOnCall:
    """The trainer's real sampler, which sends `sig` to worker 0 just before its `at`-th batch."""

    def __init__(self, sampler, pool, sig, at):
        self.sampler, self.pool, self.sig, self.at, self.calls = sampler, pool, sig, at, 0

    def generate(self, prompts, sampling):
        self.calls += 1
        if self.calls == self.at:
            self.victim = self.pool.transport.procs[0]
            os.kill(self.victim.pid, self.sig)
        return self.sampler.generate(prompts, sampling)

    def update_weights(self, weights):
        self.sampler.update_weights(weights)

    def sleep(self):
        self.sampler.sleep()


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGSTOP], ids=["killed", "hung"])
def test_a_failed_worker_aborts_one_episode_and_the_step_completes(tiny_model_dir, tmp_path, sig):
    config = small_config(tmp_path / "run", 1, env_pool={"workers": 6, "step_timeout_s": 3.0})  # 2 tasks x 3 = 6 slots
    trainer = RLTrainer(config, str(tiny_model_dir), Path(config.run_dir))
    try:
        trainer.sampler = injector = SignalOnCall(trainer.sampler, trainer.pool, sig, at=2)
        metrics = trainer.train_step()
        assert metrics["rollout/aborted"] == 1 and metrics["rollout/dropped_groups"] == 1
        assert len(trainer.pool.faults) == 1
        assert not injector.victim.is_alive() and trainer.pool.transport.procs[0].is_alive()  # replaced
        metrics = trainer.train_step()  # the replacement serves the next step
        assert metrics["rollout/aborted"] == 0
    finally:
        trainer.close()


@pytest.mark.timeout(120)  # an error swallowed leaves its slot unanswered: the call would wait forever
def test_an_environment_error_is_raised_not_hidden():
    with EnvPool(HouseholdEnvConfig(), EnvPoolConfig(workers=2)) as pool:
        with pytest.raises(WorkerEnvError, match="layout|task|split"):
            pool.reset({0: "no-such-split-7"})


def test_scienceworld_workers_leave_no_jvm_behind(scienceworld_splits):
    from agentrl.envs.scienceworld.env import ScienceWorldEnvConfig

    before = set(java_processes())
    pool = EnvPool(ScienceWorldEnvConfig(splits_dir=scienceworld_splits), EnvPoolConfig(workers=2))
    try:
        tasks = pool.local.split_tasks("l0")[:2]
        pool.reset({0: tasks[0], 1: tasks[1]})
        assert len(set(java_processes()) - before) == 3  # the pool's own + one per environment
        os.kill(pool.transport.procs[0].pid, signal.SIGKILL)  # its JVM must follow it
        results = pool.step({0: "look around", 1: "look around"})
        assert results[0] is None and results[1] is not None
    finally:
        pool.close()
    deadline = time.monotonic() + 20
    while set(java_processes()) - before and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not set(java_processes()) - before


def test_a_dead_worker_aborts_every_message_it_still_owed():
    """Async rollouts queue one message per episode: a worker holding several slots owes several
    answers when it dies, and every one of them is an aborted episode; the others go on."""
    from agentrl.envs.latency import LatencyEnvConfig

    env = LatencyEnvConfig(inner={"type": "household"}, step_median_s=0.5, step_sigma=0.0)
    with EnvPool(env, EnvPoolConfig(workers=2)) as pool:  # worker 0 holds slots 0 and 2
        observations = pool.reset({slot: f"train-{slot}" for slot in range(3)})
        for slot in (0, 2, 1):
            pool.submit("step", {slot: observations[slot].admissible_actions[0]})
        pool.transport.procs[0].kill()
        answers = {}
        while pool.pending:
            answers.update(pool.receive())
        assert answers[0] is None and answers[2] is None and answers[1] is not None
        assert len(pool.faults) == 1 and "worker 0 exited during a step" in pool.faults[0]
        assert all(pool.reset({0: "train-0", 2: "train-2"}).values())  # the replacement serves new episodes


def test_workers_that_crash_after_answering_are_replaced_every_time():
    """Only a worker that dies before its first answer, START_FAILURES times in a row, stops the run
    (a script without the main guard); one that served and then crashed is replaced each time."""
    from agentrl.envs.pool import START_FAILURES

    with EnvPool(HouseholdEnvConfig(), EnvPoolConfig(workers=1)) as pool:
        for _ in range(START_FAILURES + 1):
            assert pool.reset({0: "train-0"})[0] is not None  # this incarnation answered
            victim = pool.transport.procs[0]
            victim.kill()
            victim.join()
            assert pool.step({0: "look"})[0] is None  # its episode aborted, the worker replaced
        assert len(pool.faults) == START_FAILURES + 1
        assert "before their first answer" not in pool.fault_summary()


def test_a_worker_dead_while_idle_aborts_a_tried_move_and_an_expert_question():
    """Like a step, a tried move (`sampling.retries`) or DAgger's question to the expert sent to a
    worker that died while idle is answered None (the episode aborted), not asked of its replacement,
    which holds no such episode."""
    with EnvPool(HouseholdEnvConfig(), EnvPoolConfig(workers=1)) as pool:
        for ask in (lambda: pool.step({0: "look"}, tentative=frozenset({0})), lambda: pool.expert([0])):
            assert pool.reset({0: "train-0"})[0] is not None
            victim = pool.transport.procs[0]
            victim.kill()
            victim.join()
            assert ask() == {0: None}
        assert len(pool.faults) == 2 and all("exited while idle" in f for f in pool.faults)


def test_replacements_that_die_before_answering_stop_the_run_after_a_worker_that_served():
    """Each incarnation is judged on its own: after one that answered and then died, START_FAILURES
    replacements in a row that die before their first answer stop the run (the 2 s reset keeps
    any from answering before it is killed)."""
    from agentrl.envs.latency import LatencyEnvConfig
    from agentrl.envs.pool import START_FAILURES
    from agentrl.errors import RunError

    slow = LatencyEnvConfig(inner={"type": "household"}, reset_median_s=2.0, step_median_s=0.0, step_sigma=0.0)
    with EnvPool(slow, EnvPoolConfig(workers=1, reset_timeout_s=60.0)) as pool:
        assert pool.reset({0: "train-0"})[0] is not None  # the first incarnation answered
        with pytest.raises(RunError, match=f"exited before answering {START_FAILURES} times in a row"):
            for _ in range(START_FAILURES + 1):  # the first that dies had answered: it does not count
                pool.submit("reset", {0: "train-0"})
                victim = pool.transport.procs[0]
                victim.kill()
                victim.join()
                assert pool.receive() == {0: None}


def test_start_failures_count_in_a_row_and_an_answer_starts_the_count_again():
    """Twice, START_FAILURES - 1 incarnations die before answering and then one answers: never
    START_FAILURES in a row, so the run goes on (the 1 s reset keeps any from answering before it
    is killed)."""
    from agentrl.envs.latency import LatencyEnvConfig
    from agentrl.envs.pool import START_FAILURES

    slow = LatencyEnvConfig(inner={"type": "household"}, reset_median_s=1.0, step_median_s=0.0, step_sigma=0.0)
    with EnvPool(slow, EnvPoolConfig(workers=1, reset_timeout_s=60.0)) as pool:
        for _ in range(2):
            for _ in range(START_FAILURES - 1):
                pool.submit("reset", {0: "train-0"})
                victim = pool.transport.procs[0]
                victim.kill()
                victim.join()
                assert pool.receive() == {0: None}
            assert pool.reset({0: "train-0"})[0] is not None
        assert len(pool.faults) == 2 * (START_FAILURES - 1)


def test_hung_workers_are_replaced_every_time_not_counted_as_failed_starts():
    """A worker that hangs before its first answer is killed at its time limit and replaced, however
    often in a row: only one that exits before answering counts towards START_FAILURES (its cause,
    a missing main guard, is what that error names)."""
    from agentrl.envs.latency import LatencyEnvConfig
    from agentrl.envs.pool import START_FAILURES

    hung = LatencyEnvConfig(reset_median_s=5.0, step_median_s=0.0, step_sigma=0.0)
    with EnvPool(hung, EnvPoolConfig(workers=1, reset_timeout_s=0.3)) as pool:
        for n in range(1, START_FAILURES + 2):  # n environments: each fault says how many
            assert pool.reset({slot: "train-0" for slot in range(n)}) == dict.fromkeys(range(n))
        assert len(pool.faults) == START_FAILURES + 1 and all("did not answer a reset" in f for f in pool.faults)
        # The error message names the most recent three.
        last = "; ".join(f"worker 0 did not answer a reset of {n} environment(s) within the time limit "
                         f"(rl.env_pool.reset_timeout_s = 0.3 each)" for n in range(START_FAILURES - 1, START_FAILURES + 2))
        assert pool.fault_summary() == f"{START_FAILURES + 1} worker faults, the last: {last}"


@pytest.mark.parametrize("short", [0, 1])
def test_a_hung_worker_is_failed_at_its_own_deadline_not_at_a_later_ones(short):
    """Two workers hang, one on a step of 1 environment (0.5 s allowed), the other on 4 (2 s): the
    first is failed and its episode answered at 0.5 s, without waiting for the other's limit,
    whichever of the two workers it is."""
    import time

    from agentrl.envs.latency import LatencyEnvConfig

    hung = LatencyEnvConfig(step_median_s=10.0, step_sigma=0.0)
    with EnvPool(hung, EnvPoolConfig(workers=2, step_timeout_s=0.5)) as pool:  # slot i in worker i % 2
        long = 1 - short
        slots = [short, long, long + 2, long + 4, long + 6]
        observations = pool.reset({slot: f"train-{slot % 3}" for slot in slots})
        start = time.monotonic()
        pool.submit("step", {slot: observations[slot].admissible_actions[0] for slot in slots})
        assert pool.receive() == {short: None} and time.monotonic() - start < 1.5
        assert pool.receive() == {slot: None for slot in slots[1:]}


def test_the_latency_wrapper_waits_each_calls_median_and_plays_the_inner_game():
    """`latency` with sigma 0: each reset and step waits its median, capped at `max_s`, and the
    game is the wrapped one's."""
    import time

    from agentrl.envs.base import make_env
    from agentrl.envs.latency import LatencyEnvConfig

    inner = make_env(HouseholdEnvConfig())
    env = make_env(LatencyEnvConfig(reset_median_s=0.2, reset_sigma=0.0, step_median_s=0.05, step_sigma=0.0))
    capped = make_env(LatencyEnvConfig(step_median_s=5.0, step_sigma=0.0, max_s=0.1))
    for game in (env, capped):
        assert game.reset("train-3").text == inner.reset("train-3").text
    start = time.perf_counter()
    first = env.reset("train-3")
    reset = time.perf_counter() - start
    start = time.perf_counter()
    steps = [env.step(first.admissible_actions[0]) for _ in range(4)]
    stepped = time.perf_counter() - start
    assert 0.2 <= reset < 0.6 and 0.2 <= stepped < 0.6, (reset, stepped)
    assert [s.observation.text for s in steps] == [inner.step(first.admissible_actions[0]).observation.text
                                                   for _ in range(4)]
    start = time.perf_counter()
    capped.step(None)
    assert 0.1 <= time.perf_counter() - start < 0.5
