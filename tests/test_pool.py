from agentrl.config import HouseholdEnvConfig
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
    with EnvPool(HouseholdEnvConfig(), workers=0) as local:
        expected = play(local)
    with EnvPool(HouseholdEnvConfig(), workers=2) as pool:
        assert play(pool) == expected
        procs = list(pool._procs)
    assert all(not p.is_alive() for p in procs)
