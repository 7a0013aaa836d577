"""prompt.full_history: an episode as one growing chat, token in, token out. Each prompt is the
previous prompt, the tokens sampled for its response and the next user turn, so the rollout's
prompts are what the chat template renders for the conversation, the sampled tokens are never
re-tokenized, SFT data of the format encodes to the prompts the rollout builds, and an episode's
steps pack into one tree whose log-probs and gradients equal those of each step on its own."""

import copy
import random

import pytest
import torch
from test_packing import assert_packed_equals_plain

from agentrl.config import ConfigError, EnvPoolConfig, PromptConfig, SamplingConfig
from agentrl.envs.household.env import HouseholdEnvConfig
from agentrl.envs.pool import EnvPool
from agentrl.gcd.judge import judge_ids
from agentrl.models import load_model, load_tokenizer
from agentrl.packing import TrainSample, row_length
from agentrl.prompting import ChatTurns, encode_prompt
from agentrl.rollout.collect import collect
from agentrl.sampler.base import Generation
from agentrl.sampler.hf import HFSampler

FULL = PromptConfig(full_history=True, history_length=0)
# Another template: a role prefix in the turn's text, two newlines after the stop token.
ZEPHYR = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + ': ' + m['content'] + '<|endoftext|>' + '\n\n' }}"
          "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant: ' }}{% endif %}")


def reply(tokenizer, text: str, stop: bool = True) -> list[int]:
    return tokenizer(text, add_special_tokens=False).input_ids + ([tokenizer.eos_token_id] if stop else [])


@pytest.mark.parametrize("template", ["chatml", "zephyr", "another stop"])
def test_appended_turns_are_what_the_chat_template_renders(tiny_model_dir, template):
    """Turn by turn, the ids decode to the template's rendering of the whole conversation, with a
    reply that ended on its stop token and one cut off before it (the turn is closed for it).
    "another stop": the turn ends with a special token other than the tokenizer's end-of-sequence
    one (as with Qwen2.5's and Llama 3's base tokenizers)."""
    tokenizer = load_tokenizer(tiny_model_dir)
    if template == "zephyr":  # its turns end with the model's stop token, as real tokenizers' do
        tokenizer.chat_template, tokenizer.eos_token = ZEPHYR, "<|endoftext|>"
    if template == "another stop":
        tokenizer.chat_template = ZEPHYR
        assert tokenizer.eos_token != "<|endoftext|>"
    turns = ChatTurns(tokenizer)
    messages = [{"role": "user", "content": "Task: find the key.\nObservation: a hall."},
                {"role": "assistant", "content": "<think>look</think><action>go north</action>"},
                {"role": "user", "content": "Observation: a kitchen."},
                {"role": "assistant", "content": "<think>cut off"},
                {"role": "user", "content": "Observation: a cellar."}]
    ids = turns.first(messages[0]["content"])
    stop = tokenizer.convert_tokens_to_ids("<|endoftext|>") if template == "another stop" else tokenizer.eos_token_id
    ids = turns.next(ids, reply(tokenizer, messages[1]["content"], stop=False) + [stop], messages[2]["content"])
    ids = turns.next(ids, reply(tokenizer, messages[3]["content"], stop=False), messages[4]["content"])
    rendered = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert tokenizer.decode(ids) == rendered


CHATML_TURN = "{{ '<|im_start|>' + m['role'] + '\\n' + c + '<|im_end|>\\n' }}{% endfor %}" \
              "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
REWRITING = {
    # every reply but the last marked
    "marks earlier replies": "{% for m in messages %}{% set c = m['content'] %}{% if m['role'] == 'assistant' "
                             "and not loop.last %}{% set c = '(earlier) ' + c %}{% endif %}" + CHATML_TURN,
    # as DeepSeek-R1's: a reply's reasoning never rendered
    "drops all reasoning": "{% for m in messages %}{% set c = m['content'] %}{% if m['role'] == 'assistant' "
                           "%}{% set c = c.split('</think>')[-1] %}{% endif %}" + CHATML_TURN,
    # as Qwen3's thinking templates: the reasoning of replies before the last user turn dropped
    "drops earlier reasoning": "{% set ns = namespace(last=0) %}{% for m in messages %}{% if m['role'] == 'user' %}"
                               "{% set ns.last = loop.index0 %}{% endif %}{% endfor %}"
                               "{% for m in messages %}{% set c = m['content'] %}{% if m['role'] == 'assistant' "
                               "and loop.index0 < ns.last %}{% set c = c.split('</think>')[-1] %}{% endif %}"
                               + CHATML_TURN,
}


@pytest.mark.parametrize("rewrite", sorted(REWRITING))
def test_a_template_that_rewrites_earlier_turns_is_refused(tiny_model_dir, rewrite):
    """A template that renders a reply otherwise once another turn follows it: appended turns would
    not be what it renders, so full history refuses it before any episode, naming the setting."""
    tokenizer = load_tokenizer(tiny_model_dir)
    tokenizer.chat_template = REWRITING[rewrite]
    with pytest.raises(ConfigError, match=r"prompt\.full_history: its chat template renders an earlier reply"):
        ChatTurns(tokenizer)


def test_the_sampled_tokens_are_kept_not_re_tokenized(tiny_model_dir):
    """A reply sampled as single characters, which the tokenizer would merge if it re-read the
    text: the next prompt holds those very tokens."""
    tokenizer = load_tokenizer(tiny_model_dir)
    turns = ChatTurns(tokenizer)
    text = "<action>go north</action>"
    by_character = [i for c in text for i in tokenizer(c, add_special_tokens=False).input_ids]
    assert by_character != tokenizer(text, add_special_tokens=False).input_ids  # re-reading would differ
    prompt = turns.first("Task: find the key.")
    after = turns.next(prompt, by_character + [tokenizer.eos_token_id], "Observation: a kitchen.")
    assert after[:len(prompt) + len(by_character) + 1] == prompt + by_character + [tokenizer.eos_token_id]


@pytest.fixture(scope="module")
def episodes(tiny_model_dir):
    """Two tasks x 2 rollouts of 4 steps of the household with the tiny model, full history."""
    tokenizer = load_tokenizer(tiny_model_dir)
    sampler = HFSampler(load_model(tiny_model_dir), tokenizer)
    torch.manual_seed(0)
    with EnvPool(HouseholdEnvConfig(max_steps=4), EnvPoolConfig(workers=0)) as pool:
        trajectories = collect(pool, sampler, tokenizer, ["train-3", "train-8"], 2, FULL,
                               SamplingConfig(temperature=1.0, max_new_tokens=12))
    return tokenizer, trajectories


def test_each_prompt_is_the_last_prompt_its_sampled_response_and_the_next_turn(episodes):
    tokenizer, trajectories = episodes
    turns = ChatTurns(tokenizer)
    assert all(len(t.steps) >= 2 for t in trajectories)
    for t in trajectories:
        first = t.steps[0]
        assert first.prompt_ids == encode_prompt(tokenizer, first.prompt) and "Your task is to" in first.prompt
        for before, step in zip(t.steps, t.steps[1:]):
            assert step.prompt.startswith("Observation: ") and "\nAdmissible actions: " in step.prompt  # turn_template
            assert step.prompt_ids == turns.next(before.prompt_ids, before.response_ids, step.prompt)


def test_an_episode_packs_into_one_tree_with_the_log_probs_and_gradients_of_its_steps(episodes, tiny_model_dir):
    """Packed, an episode's steps share everything but the one turn each adds (the response of a
    step is computed again as the next step's context); log-probs, loss and every gradient equal
    those of each step as its own sample (float noise: 1e-6 of a gradient's largest element)."""
    tokenizer, trajectories = episodes
    g = torch.Generator().manual_seed(0)
    samples = [TrainSample.from_turn(s.prompt_ids, s.response_ids, old_logprobs=s.logprobs,
                                     advantages=torch.randn(len(s.response_ids), generator=g).tolist())
               for t in trajectories for s in t.steps]
    model = load_model(tiny_model_dir).float()
    plain_tokens, packed_tokens = assert_packed_equals_plain(model, samples, grad_noise=1e-6)  # long sequences
    for t in trajectories:  # one episode's row: its last prompt plus each step's response once more
        steps = [TrainSample.from_turn(s.prompt_ids, s.response_ids) for s in t.steps]
        assert row_length(steps) == len(steps[-1].ids) + sum(len(s.response_ids) for s in t.steps[:-1])
    assert packed_tokens < 0.6 * plain_tokens


@pytest.mark.parametrize("template", ["chatml", "zephyr"])
def test_full_history_expert_data_encodes_to_the_prompts_the_rollout_builds(tiny_model_dir, template):
    """SFT on expert data of the format trains the token sequences the rollout gives the sampler:
    the expert's episode replayed through the rollout (its replies as the sampled tokens) asks
    with exactly the prompt ids of each example. (With the second template, the conversation
    rendered and tokenized in one piece would not: "assistant: <think>" tokenizes otherwise.)"""
    from agentrl.data import encode_conversation, expert_episode
    from agentrl.envs.household import HouseholdEnv

    tokenizer = load_tokenizer(tiny_model_dir)
    if template == "zephyr":
        tokenizer.chat_template, tokenizer.eos_token = ZEPHYR, "<|endoftext|>"
    env = HouseholdEnv(max_steps=8)
    examples = expert_episode(env, "train-3", FULL)
    assert len(examples) >= 3
    assert [len(e["messages"]) for e in examples] == [2 * (i + 1) for i in range(len(examples))]

    class Replay:
        """Answers each prompt with the expert's reply of the example of that step."""

        def __init__(self):
            self.step = 0

        def generate(self, prompts, params):
            text = examples[self.step]["messages"][-1]["content"]
            self.step += 1
            return [Generation(reply(tokenizer, text), [0.0]) for _ in prompts]

    with EnvPool(HouseholdEnvConfig(max_steps=8), EnvPoolConfig(workers=0)) as pool:
        trajectory = collect(pool, Replay(), tokenizer, ["train-3"], 1, FULL, SamplingConfig())[0]
    assert trajectory.success and len(trajectory.steps) == len(examples)
    for step, example in zip(trajectory.steps, examples):
        encoded = encode_conversation(tokenizer, example["messages"])
        assert encoded.ids == step.prompt_ids + step.response_ids


def test_full_history_expert_data_with_detours_shows_the_moves_played():
    """With detours (DART) an example still teaches the expert's move, and its earlier turns show the
    moves the episode played, detours among them: replaying those in a fresh environment gives each
    later turn's observation."""
    from agentrl.data import expert_episode
    from agentrl.envs.household import HouseholdEnv
    from agentrl.prompting import parse_action

    examples = expert_episode(HouseholdEnv(max_steps=8), "train-3", FULL, detours=0.5, rng=random.Random(0))
    assert len(examples) >= 3
    turns = examples[-1]["messages"]
    replay = HouseholdEnv(max_steps=8)
    replay.reset("train-3")
    detoured = False
    for k in range(1, len(turns) // 2):
        played = parse_action(turns[2 * k - 1]["content"])
        assert replay.step(played).observation.text in turns[2 * k]["content"]
        detoured |= played != parse_action(examples[k - 1]["messages"][-1]["content"])
    assert detoured  # a move played was not the expert's label


def test_what_reads_a_step_prompt_as_text_is_refused_with_full_history():
    """The GCD judges are given the episode (below); the coupling lab reads a step's prompt text."""
    from agentrl.recipe import validate_config

    for judge in ({"judge": "classifier"}, {"labels": ["llm", "env"], "external": {"base_url": "http://127.0.0.1:1",
                                                                                    "model": "m"}}):
        validate_config({"prompt": {"full_history": True}, "rl": {"aux": [{"type": "gcd", **judge}]}})
    with pytest.raises(Exception, match=r"rl\.components\[0\] \(coupling\) reads"):
        validate_config({"prompt": {"full_history": True}, "rl": {"components": [{"type": "coupling"}]}})
    validate_config({"prompt": {"full_history": True}, "rl": {"components": [{"type": "nthr"}]}})


def test_the_gcd_judge_is_asked_in_the_episodes_own_conversation(episodes, tiny_model_dir):
    """With full history the actor judges a step as the next user turn of its episode: the judge's
    prompt holds every token of the conversation up to the step's sampled reply (the tokens the
    next step's prompt holds there too), then the question naming the action; the generative
    judge samples its verdicts from it and the classifier reads it."""
    from agentrl.gcd.judge import judge_question
    from agentrl.gcd.labels import LabeledStep
    from agentrl.gcd.loss import ClassifierJudgeLoss, GCDAuxConfig, GCDLoss

    tokenizer, trajectories = episodes
    turns = ChatTurns(tokenizer)
    trajectory = max(trajectories, key=lambda t: len(t.steps))
    config = GCDAuxConfig(pairs_per_step=2, group_size=2, sampling={"max_new_tokens": 4})
    sampler = HFSampler(load_model(tiny_model_dir), tokenizer)
    generative = GCDLoss(config, sampler, tokenizer, seed=0, turns=turns)
    classifier = ClassifierJudgeLoss(config.model_copy(update={"judge": "classifier"}), sampler.model, tokenizer,
                                     seed=0, turns=turns)
    for step, after in zip(trajectory.steps, trajectory.steps[1:]):
        asked = judge_ids(tokenizer, step, turns)
        shared = len(step.prompt_ids) + len(step.response_ids)
        assert asked[:shared] == step.prompt_ids + step.response_ids
        reply_turn_ends = len(after.prompt_ids) - len(turns.user(after.prompt))
        assert asked[:reply_turn_ends] == after.prompt_ids[:reply_turn_ends]  # the reply's turn closed as the episode closes it
        assert tokenizer.decode(asked[reply_turn_ends:]).count(judge_question(step)) == 1
        assert classifier._sample(LabeledStep(step, True, "env", "")).ids[:-1] == asked
    labelled = copy.deepcopy(trajectory)
    for i, s in enumerate(labelled.steps):  # the environment's labels: every other move makes progress
        s.progress = i % 2 == 0
    asked = {tuple(judge_ids(tokenizer, s, turns)) for s in trajectory.steps}
    samples = generative.prepare([labelled], step=1).samples  # a good and a bad step, 2 verdicts each
    assert len(samples) == 4 and all(tuple(s.ids[:len(s.ids) - s.n_targets]) in asked for s in samples)


def test_the_external_judge_is_sent_the_episodes_conversation(episodes):
    """With full history the external judge (over a real HTTP server on 127.0.0.1 that records what
    it is sent) gets each step's episode so far as a chat: every earlier turn, the step's prompt
    and reply, then the question."""
    import json
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from agentrl.gcd.judge import ChatEndpoint, ExternalJudge, judge_question
    from agentrl.gcd.loss import GCDAuxConfig, GCDLoss

    received = []

    class Recorder(BaseHTTPRequestHandler):
        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            received.append(body["messages"])
            reply = json.dumps({"choices": [{"message": {"content": "<verdict>good</verdict>"}}] * body["n"]}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)

        def log_message(self, *args):
            pass

    tokenizer, trajectories = episodes
    trajectory = max(trajectories, key=lambda t: len(t.steps))
    server = ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_port}/v1"
        config = GCDAuxConfig(labels=["llm"], external={"base_url": url, "model": "m", "pairs_per_step": 99})
        external = ExternalJudge(ChatEndpoint(url, "m", None, 10), asks=2, agree=2, temperature=0.0, max_tokens=8)
        judge = GCDLoss(config, None, tokenizer, seed=0, external=external, turns=ChatTurns(tokenizer))
        assert judge.prepare([trajectory], step=1).metrics["labels/llm_good"] == len(trajectory.steps)
    finally:
        server.shutdown()
        server.server_close()
    expected = [[m for s in trajectory.steps[:k + 1] for m in ({"role": "user", "content": s.prompt},
                                                              {"role": "assistant", "content": s.response})]
                + [{"role": "user", "content": judge_question(trajectory.steps[k])}] for k in range(len(trajectory.steps))]
    assert sorted(map(json.dumps, received)) == sorted(map(json.dumps, expected))


def test_rl_trains_the_gcd_judge_on_full_history_episodes(tiny_model_dir, tmp_path):
    """The run's GCD judge (as the registry builds it) asks in each episode's conversation, and an RL
    step with it trains."""
    from agentrl.recipe import validate_config
    from agentrl.trainer import RLTrainer

    config = validate_config({
        "seed": 1, "run_dir": str(tmp_path), "env": {"type": "household", "max_steps": 3},
        "prompt": {"full_history": True, "history_length": 0}, "sampling": {"max_new_tokens": 8},
        "rl": {"steps": 2, "tasks_per_step": 2, "group_size": 2, "mini_batch_size": 64,
               "aux": [{"type": "gcd", "pairs_per_step": 2, "group_size": 2, "sampling": {"max_new_tokens": 6}}]}})
    with RLTrainer(config, str(tiny_model_dir), tmp_path) as trainer:
        labelled = copy.deepcopy(max(trainer.rollout(1), key=lambda t: len(t.steps)))
        for i, s in enumerate(labelled.steps):
            s.progress = i % 2 == 0
        samples = trainer.component("gcd").prepare([labelled], step=1).samples
        metrics = trainer.train_step()
    starts = [s.prompt_ids + s.response_ids for s in labelled.steps]
    assert len(samples) == 4 and all(any(s.ids[:len(p)] == p for p in starts) for s in samples)
    assert "aux/gcd/pairs" in metrics


def test_each_state_prompt_is_built_once(tiny_model_dir):
    """With a context to check against, the prompt the check builds is the one sampled: the chat
    template renders each step's prompt once (and twice when the rules are made: the probe reply,
    then the probe with a turn after it)."""
    tokenizer = load_tokenizer(tiny_model_dir)
    sampler, render = HFSampler(load_model(tiny_model_dir), tokenizer), tokenizer.apply_chat_template
    sampler.context_length, renders = 100_000, []
    tokenizer.apply_chat_template = lambda *a, **k: renders.append(1) or render(*a, **k)
    torch.manual_seed(0)
    with EnvPool(HouseholdEnvConfig(max_steps=4), EnvPoolConfig(workers=0)) as pool:
        trajectories = collect(pool, sampler, tokenizer, ["train-3", "train-8"], 2, FULL,
                               SamplingConfig(temperature=1.0, max_new_tokens=8))
    assert sum(len(t.steps) for t in trajectories) > 4
    assert len(renders) == 2 + sum(len(t.steps) for t in trajectories)


def test_an_episode_ends_where_its_next_turn_would_pass_the_context(tiny_model_dir):
    """With a context that only the shortest last turn fits, every prompt sampled leaves room for a reply; the
    episodes that ended for it are marked (the metric, the evaluation summary and the records say
    so) and ended only where the turn the unlimited run played next would not have fitted; the GCD judge
    leaves out the steps whose question and answer would not fit, and says how many."""
    from agentrl.dagger import play_labelled
    from agentrl.evaluate import summarize
    from agentrl.gcd.loss import GCDAuxConfig, GCDLoss
    from agentrl.rollout.records import from_record, to_record
    from agentrl.trainer import rollout_metrics

    tokenizer = load_tokenizer(tiny_model_dir)
    sampler, turns, reply = HFSampler(load_model(tiny_model_dir), tokenizer), ChatTurns(tokenizer), 12

    def play():
        torch.manual_seed(0)
        with EnvPool(HouseholdEnvConfig(max_steps=6), EnvPoolConfig(workers=0)) as pool:
            return collect(pool, sampler, tokenizer, ["train-3", "train-8"], 2, FULL,
                           SamplingConfig(temperature=1.0, max_new_tokens=reply))

    unlimited = play()
    assert not any(t.context_ended for t in unlimited)
    limit = sampler.context_length = min(len(t.steps[-1].prompt_ids) for t in unlimited) + reply
    trajectories = play()
    ended = [t for t in trajectories if t.context_ended]
    assert 0 < len(ended) < len(trajectories)
    assert all(len(s.prompt_ids) + reply <= limit for t in trajectories for s in t.steps)
    for t, whole in zip(trajectories, unlimited):
        n = len(t.steps)
        if t.context_ended:  # the unlimited run's moves up to there; the turn it did not play would not have fitted
            assert [s.response_ids for s in t.steps] == [s.response_ids for s in whole.steps[:n]]
            assert n < 6 and not t.success and len(whole.steps[n].prompt_ids) + reply > limit
        else:
            assert n == 6
    assert rollout_metrics(trajectories)["rollout/context_ended"] == len(ended)
    assert summarize(trajectories)["context_ended"] == len(ended)
    assert [from_record(to_record(t)).context_ended for t in trajectories] == [t.context_ended for t in trajectories]
    with EnvPool(HouseholdEnvConfig(max_steps=6), EnvPoolConfig(workers=0)) as pool:  # DAgger plays the same way
        played = play_labelled(pool, sampler, tokenizer, ["train-3", "train-8"], FULL,
                               SamplingConfig(temperature=1.0, max_new_tokens=reply), 0.0, random.Random(0))
    assert any(t.context_ended for t in played.trajectories)

    labelled = copy.deepcopy(trajectories)
    for t in labelled:
        for i, s in enumerate(t.steps):
            s.progress = i % 2 == 0
    answer = 40
    config = GCDAuxConfig(labels=["env"], pairs_per_step=40, group_size=2, sampling={"max_new_tokens": answer})
    judge = GCDLoss(config, sampler, tokenizer, seed=0, turns=turns)
    too_long = sum(len(judge_ids(tokenizer, s, turns)) + answer > limit for t in labelled for s in t.steps)
    prepared = judge.prepare(labelled, step=1)  # the sampler refuses a prompt past its context
    assert prepared.metrics["too_long"] == too_long > 0 and prepared.samples
    assert all(len(s.ids) <= limit for s in prepared.samples)


def test_a_prompt_past_the_models_positions_is_refused(tiny_model_dir):
    """The model would not fail on its own (rotary positions extrapolate): the sampler refuses."""
    from agentrl.errors import RunError

    tokenizer = load_tokenizer(tiny_model_dir)
    sampler = HFSampler(load_model(tiny_model_dir), tokenizer)
    limit = sampler.model.config.max_position_embeddings
    params = SamplingConfig(max_new_tokens=4)
    assert len(sampler.generate([[5] * (limit - 4)], params)) == 1
    with pytest.raises(RunError, match=f"reaches {limit + 1} tokens, past the model's {limit} positions"):
        sampler.generate([[5] * 8, [5] * (limit - 3)], params)


def test_a_turn_counts_the_steps_taken_before_it(tiny_model_dir):
    """`{step}` in `prompt.turn_template` is the number of steps taken, as in the first prompt's
    template: step k's turn (k >= 1) says k."""
    tokenizer, model = load_tokenizer(tiny_model_dir), load_model(tiny_model_dir)
    prompt = PromptConfig(full_history=True, history_length=0,
                          turn_template="Step {step}. Observation: {observation}\nAdmissible actions: {actions}")
    torch.manual_seed(0)
    with EnvPool(HouseholdEnvConfig(max_steps=4), EnvPoolConfig(workers=0)) as pool:
        [trajectory] = collect(pool, HFSampler(model, tokenizer), tokenizer, ["train-3"], 1, prompt,
                               SamplingConfig(temperature=1.0, max_new_tokens=8))
    turns = [s.prompt.split(".")[0] for s in trajectory.steps[1:]]
    assert len(turns) >= 2 and turns == [f"Step {k}" for k in range(1, len(trajectory.steps))]


def test_the_next_turn_computes_only_what_the_kept_cache_has_not(tiny_model_dir):
    """After a reply that ended on its stop token, the next turn reads the prompt and the reply
    from the kept cache (all but the reply's last token, which was sampled, not yet computed) and
    computes only the rest: that token, the turn's closing and the new user turn."""
    tokenizer, model = load_tokenizer(tiny_model_dir), load_model(tiny_model_dir)
    sampler, turns, params = HFSampler(model, tokenizer, keep_mib=64), ChatTurns(tokenizer), \
        SamplingConfig(temperature=1.0, max_new_tokens=12)
    first = turns.first("Task: put a mug in the cabinet.\nObservation: you are in the kitchen.")
    torch.manual_seed(0)
    [probe] = HFSampler(model, tokenizer).generate([first], params)
    stop = next(i for i, t in enumerate(probe.token_ids) if i >= 2 and t not in probe.token_ids[:i])
    sampler.eos_id = probe.token_ids[stop]  # the same draw stops there: a reply of 3 tokens or more
    torch.manual_seed(0)
    [reply] = sampler.generate([first], params)
    assert reply.token_ids == probe.token_ids[:stop + 1]
    second = turns.next(first, reply.token_ids, "Observation: you open the cabinet.")
    computed = sampler.kept.computed
    sampler.generate([second], params)
    assert sampler.kept.computed - computed == len(second) - len(first) - len(reply.token_ids)


def test_a_sampler_keeping_each_episodes_cache_samples_what_prefilling_every_prompt_samples(tiny_model_dir):
    """`keep_cache_mib`: the shared decoder keeps each prompt's and reply's keys and values, so an
    episode's next turn prefills only the new turn. Seeded, it samples the same tokens with the
    same log-probs as a sampler that prefills every prompt whole; it reads more prefix tokens than
    it computes; within a small budget it keeps no more than the budget; and once the weights
    change in place (as an update changes them), nothing computed with the old ones is read; `sleep`
    (called before each update) frees all it keeps."""
    tokenizer, model = load_tokenizer(tiny_model_dir), load_model(tiny_model_dir)

    def play(sampler, seed):
        torch.manual_seed(seed)
        with EnvPool(HouseholdEnvConfig(max_steps=5), EnvPoolConfig(workers=0)) as pool:
            trajectories = collect(pool, sampler, tokenizer, ["train-3", "train-8"], 2, FULL,
                                   SamplingConfig(temperature=1.0, max_new_tokens=12))
        steps = [s for t in trajectories for s in t.steps]
        return [s.response_ids for s in steps], torch.tensor([p for s in steps for p in s.logprobs])

    kept, small, plain = (HFSampler(model, tokenizer, keep_mib=64), HFSampler(model, tokenizer, keep_mib=1),
                          HFSampler(model, tokenizer))
    assert plain.kept is None
    for seed in (0, 1):
        tokens, logprobs = play(plain, seed)
        for sampler in (kept, small):
            their_tokens, their_logprobs = play(sampler, seed)
            assert their_tokens == tokens and len(tokens) >= 12
            torch.testing.assert_close(their_logprobs, logprobs, atol=1e-5, rtol=0)
        if seed == 0:
            assert kept.kept.reused > 2 * kept.kept.computed  # later turns read the earlier ones
            assert len(kept.kept.entries) == 4  # one per episode: a turn's sequence replaces the last turn's
            assert 0 < small.kept.bytes <= 2**20 < kept.kept.bytes
            with torch.no_grad():  # an update in place: seed 1's first prompts are kept from seed 0's
                for p in model.parameters():
                    p.mul_(1.2)
    kept.sleep()  # before an update (the trainer's order): the memory goes back to the actor
    assert kept.kept.bytes == 0 and not kept.kept.entries


def test_the_kept_cache_keeps_the_most_recently_read_within_its_budget(tiny_model_dir):
    """The kept cache's own bookkeeping: a sequence read becomes the most recent, so the one read
    longest ago leaves first; a sequence kept again is counted once; one larger than the whole
    budget is not kept (nor is the rest evicted for it); a change to any parameter, not only the
    first, forgets everything."""
    from agentrl.sampler.shared_decode import KeptCache

    model = load_model(tiny_model_dir)
    length = KeptCache.LEAD + 8
    size = 2 * length * 64 * 4  # one layer's keys and values, (1, length, 64) in float32

    def states(n: int = length) -> list[tuple]:
        return [(torch.zeros(1, n, 64), torch.zeros(1, n, 64))]

    kept = KeptCache(model, budget_mib=2.5 * size / 2**20)
    kept.check_weights()  # (as each generation call does first)
    a, b, c = ([token] * length for token in (1, 2, 3))
    kept.put(a, states())
    kept.put(b, states())
    kept.put(a, states())  # the same sequence again (a turn sampled twice): one entry, one size
    assert kept.bytes == 2 * size and set(kept.entries) == {tuple(a), tuple(b)}
    kept.take(tuple(b), 4)  # b read: a is now the one read longest ago
    kept.put(c, states())
    assert set(kept.entries) == {tuple(b), tuple(c)} and kept.bytes == 2 * size
    kept.put([4] * 3 * length, states(3 * length))  # larger than the budget on its own
    assert set(kept.entries) == {tuple(b), tuple(c)} and kept.bytes == 2 * size
    kept.check_weights()  # unchanged weights: nothing forgotten
    assert len(kept.entries) == 2
    with torch.no_grad():
        list(model.parameters())[-1].add_(1.0)  # the last parameter only
    kept.check_weights()
    assert not kept.entries and kept.bytes == 0


@pytest.mark.parametrize("shared", [False, True], ids=["distinct", "shared-start"])
def test_prefill_and_kept_turns_run_in_forwards_within_the_budget(tiny_model_dir, shared):
    """The shared decoder prefills prompts (as prefix trees), and computes kept episodes' next
    turns, in forwards of at most `budget` padded tokens, a longer prompt alone: its memory grows
    with them, and 200 long episodes at once killed issue 40's run. Each prompt's keys and values
    are those of one forward of all; prompts of distinct text, and prompts sharing a long start
    (packed into shared rows)."""
    from agentrl.packing import Packing
    from agentrl.sampler import shared_decode

    tokenizer, model = load_tokenizer(tiny_model_dir), load_model(tiny_model_dir)
    forwards = []  # (rows, padded width) of each forward
    hook = model.get_decoder().register_forward_pre_hook(
        lambda module, args, kwargs: forwards.append((len(kwargs["input_ids"]), kwargs["attention_mask"].shape[-1])),
        with_kwargs=True)
    generator = torch.Generator().manual_seed(0)

    def tokens(n):
        return torch.randint(3, len(tokenizer), (n,), generator=generator).tolist()
    start = tokens(120) if shared else []
    prefixes = [start + tokens(n) for n in (10, 30, 60, 90, 20, 45, 300, 5, 70)]
    news = [tokens(n) for n in (3, 40, 12, 25, 7, 30, 18, 1, 50)]
    budget, pack = 256, Packing.for_model(model.config)
    with torch.no_grad():
        whole = shared_decode.tree_prefill(model, prefixes, pack, tokenizer.pad_token_id, 10**9)
        steps = {"prefill": (lambda bound: shared_decode.tree_prefill(model, prefixes, pack, tokenizer.pad_token_id,
                                                                      bound), map(len, prefixes)),
                 "extend": (lambda bound: shared_decode.extend(model, whole, news, bound),
                            (len(p) + len(n) for p, n in zip(prefixes, news)))}
        for step, (run, lengths) in steps.items():
            out = {}
            for bound in (10**9, budget):
                forwards.clear()
                out[bound] = run(bound)
                assert len(forwards) == 1 if bound > budget else len(forwards) > 2
            longest = max(lengths)
            assert all(n * width <= budget or (n == 1 and width <= longest) for n, width in forwards), (step, forwards)
            for state, theirs in zip(out[10**9], out[budget]):
                for (keys, values), (their_keys, their_values) in zip(state, theirs):
                    torch.testing.assert_close(their_keys, keys, atol=1e-5, rtol=0)
                    torch.testing.assert_close(their_values, values, atol=1e-5, rtol=0)
    hook.remove()


@pytest.mark.parametrize("prompt,sampler,budget", [
    ({"full_history": True, "history_length": 0}, {}, 1024),
    ({"full_history": True, "history_length": 0}, {"keep_cache_mib": 8}, 8),
    ({"full_history": True, "history_length": 0}, {"keep_cache_mib": 0}, None),
    ({}, {}, None)], ids=["full-default", "full-8", "full-off", "window"])
def test_the_runs_sampler_keeps_each_episodes_cache_by_default_with_full_history(tiny_model_dir, prompt, sampler,
                                                                                 budget):
    """`rl.sampler.keep_cache_mib` unset: 1024 MiB kept with full history (each prompt extends the
    last), nothing with the window; as the registry builds the run's sampler."""
    from agentrl.recipe import validate_config
    from agentrl.registry import SAMPLERS

    config = validate_config({"env": {"type": "household"}, "prompt": prompt, "rl": {"sampler": sampler}})
    model, tokenizer = load_model(tiny_model_dir), load_tokenizer(tiny_model_dir)
    built = SAMPLERS.get("hf")(config.rl.sampler, str(tiny_model_dir), lambda: model, tokenizer, config)
    assert (built.kept.budget / 2**20 if built.kept else None) == budget
