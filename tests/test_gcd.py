import json
import random
import threading
from contextlib import contextmanager

import pytest
import torch
from conftest import COMPACT

from agentrl.config import PromptConfig, SFTConfig
from agentrl.data import read_chat_dataset
from agentrl.envs import make_env
from agentrl.envs.household.env import HouseholdEnvConfig
from agentrl.gcd.data import collect_judgment_data
from agentrl.gcd.judge import (ChatEndpoint, ExternalJudge, critique, judge_messages, judge_prompt, judge_question,
                              parse_verdict, vote)
from agentrl.gcd.labels import balanced_selection, label_steps, rule_labels
from agentrl.gcd.loss import GCDAuxConfig, GCDLoss, JudgeEndpointConfig
from agentrl.metrics import LossOutputs
from agentrl.models import load_model, load_tokenizer
from agentrl.packing import micro_batches
from agentrl.recipe import validate_config
from agentrl.rollout.types import StepSample, Trajectory
from agentrl.sampler.hf import HFSampler
from agentrl.serve import make_server
from agentrl.sft import train_sft
from agentrl.tracking import read_metrics
from agentrl.trainer import RLTrainer


def traj(observations, success=False, progress=None):
    progress = progress or [None] * len(observations)
    steps = [StepSample([1], [2], [0.0], response=f"a{i}", action=f"a{i}", observation=o, anchor=o,
                        prompt=f"state {o}", progress=p) for i, (o, p) in enumerate(zip(observations, progress))]
    return Trajectory("t", 0, "pick", steps, success=success)


def test_rule_labels_mark_actions_into_revisited_states_bad_and_the_winning_step_good():
    # results of steps 0..3 are observations 1..4; A (the result of step 0) re-occurs at step 3.
    t = traj(["start", "A", "B", "A", "C"], success=True)
    labels = {i: label for i, (label, _) in rule_labels(t).items()}
    assert labels == {0: False, 4: True}
    # step 1's result (B) and step 2's result (A) do not occur later; a failed episode has no good step
    assert rule_labels(traj(["s", "x", "x", "x"])) == {0: (False, rule_labels(traj(["s", "x", "x", "x"]))[0][1]),
                                                       1: rule_labels(traj(["s", "x", "x", "x"]))[1]}
    assert set(rule_labels(traj(["s", "x", "x", "x"]))) == {0, 1}


def test_label_sources_follow_priority_and_selection_is_balanced():
    t = traj(["start", "A", "B", "A", "C"], success=True, progress=[True, None, False, True, True])
    by_rules_first = {(x.step.action, x.label, x.source) for x in label_steps([t], ["rules", "env"])}
    assert by_rules_first == {("a0", False, "rules"), ("a4", True, "rules"), ("a2", False, "env"),
                              ("a3", True, "env")}
    env_first = {(x.step.action, x.label, x.source) for x in label_steps([t], ["env", "rules"])}
    assert ("a0", True, "env") in env_first
    # in episode and step order whatever source labelled each (a seeded selection draws from this order)
    assert [x.step.action for x in label_steps([t], ["rules", "env"])] == ["a0", "a2", "a3", "a4"]
    labelled = label_steps([t], ["rules", "env"])
    chosen = balanced_selection(labelled, 30, random.Random(0))
    assert sum(x.label for x in chosen) == sum(not x.label for x in chosen) == 2
    assert balanced_selection([x for x in labelled if x.label], 30, random.Random(0)) == []
    many = label_steps([traj([f"s{i}" for i in range(12)], progress=[i % 2 == 0 for i in range(12)])], ["env"])
    draws = [balanced_selection(many, 4, random.Random(seed)) for seed in range(6)]
    for label in (True, False):  # a draw among the 6 good and among the 6 bad steps, not the first of either kind
        assert len({tuple(x.step.action for x in draw if x.label is label) for draw in draws}) > 1


def test_verdict_parsing_and_voting():
    assert parse_verdict("<think>loops</think><verdict>bad</verdict>") is False
    assert parse_verdict("<verdict> GOOD </verdict>") is True
    assert parse_verdict("good") is None
    assert parse_verdict("<verdict>good</verdict><verdict>bad</verdict>") is None
    assert parse_verdict("<verdict>maybe</verdict>") is None
    assert vote([True, True, True, True, False], 4) is True
    assert vote([True, True, True, None, None], 4) is None
    assert vote([False] * 5, 4) is False
    assert vote([None] * 5, 1) is None
    assert vote([None, None, None, True, True], 2) is True  # non-answers agree with nothing, not each other


def test_household_progress_labels_match_the_expert():
    env = make_env(HouseholdEnvConfig())
    env.reset("train-3")
    _, expert = env.expert_action()
    assert env.step(expert).progress is True
    assert env.step("look").progress is False
    assert env.step("fly away").progress is False


def test_judgment_data_is_balanced_and_parseable(tmp_path):
    odd = collect_judgment_data(make_env(HouseholdEnvConfig()), PromptConfig(), 7, tmp_path / "odd.jsonl", seed=0)
    assert odd == {"judgments": 7, "good": 3, "bad": 4}  # as many as asked, the odd one bad
    path = tmp_path / "j.jsonl"
    stats = collect_judgment_data(make_env(HouseholdEnvConfig()), PromptConfig(), 12, path, seed=0)
    assert stats == {"judgments": 12, "good": 6, "bad": 6}
    answers = [c[1]["content"] for c in read_chat_dataset(path)]
    verdicts = [parse_verdict(a) for a in answers]
    assert sorted(verdicts) == [False] * 6 + [True] * 6
    # each verdict with the reason of the label it came from: good ones are the expert's moves,
    # bad ones steps the rules or the environment call bad
    reasons = {critique(a) for a, v in zip(answers, verdicts) if not v}
    assert {critique(a) for a, v in zip(answers, verdicts) if v} == {"It makes progress."}
    assert reasons and reasons <= {"It leads to a state seen again later.", "It cannot help."}


def gcd_config(**kw):
    return GCDAuxConfig(pairs_per_step=4, group_size=3, sampling={"max_new_tokens": 6}, **kw)


def test_gcd_loss_trains_only_judgment_tokens(tiny_model_dir):
    model, tokenizer = load_model(tiny_model_dir), load_tokenizer(tiny_model_dir)
    loss = GCDLoss(gcd_config(), HFSampler(model, tokenizer), tokenizer, seed=0)
    t = traj(["start", "A", "B", "A", "C"], success=True)
    batch_out = loss.prepare([t], step=1)
    assert len(batch_out.samples) == 2 * 3  # one good + one bad pair, 3 judgments each
    assert batch_out.metrics["pairs"] == 2 and 0 <= batch_out.metrics["judge_accuracy"] <= 1
    assert batch_out.metrics["too_long"] == 0  # every labelled step fits the context
    # A random model gives no verdict: wrong on both pairs, whatever their labels.
    assert loss.evaluate([t], seed=0) == {"judge_accuracy": 0.0, "verdict_parse_rate": 0.0, "judge_pairs": 2}
    # Make the advantages non-zero so a gradient exists (a random model's verdicts all score 0).
    for i, s in enumerate(batch_out.samples):
        s.advantages = [1.0 if i % 2 else -1.0] * s.n_targets
    batch = micro_batches(batch_out.samples, 10**6, tokenizer.pad_token_id)[0].to(model.device)
    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
    logits.retain_grad()
    shifted = torch.log_softmax(logits[:, :-1], -1).gather(-1, batch.input_ids[:, 1:, None])[..., 0]
    logp = shifted[batch.mask[:, 1:]]
    loss.token_loss(logp, batch).sum().backward()
    touched = logits.grad.abs().sum(-1)[:, :-1] > 0  # (B, L-1): positions whose prediction got gradient
    assert torch.equal(touched, batch.mask[:, 1:])


def judge_answering(reply: str, tiny_model_dir, out):
    """The tiny model fine-tuned to answer every judge prompt with `reply`."""
    data = out / "data.jsonl"
    prompts = [judge_prompt(s) for s in traj([f"room {i}" for i in range(8)]).steps]
    data.write_text("".join(json.dumps({"messages": [{"role": "user", "content": p}, {
        "role": "assistant", "content": reply}]}) + "\n" for p in prompts))
    train_sft(load_model(tiny_model_dir), load_tokenizer(tiny_model_dir), data,
              SFTConfig(epochs=30, batch_size=8, optim={"lr": 3e-3}), 0, out / "model")
    return out / "model"


@pytest.fixture(scope="module")
def optimist_dir(tiny_model_dir, tmp_path_factory):
    """Calls every action good."""
    return judge_answering("<verdict>good</verdict>", tiny_model_dir, tmp_path_factory.mktemp("optimist"))


@pytest.fixture(scope="module")
def pessimist_dir(tiny_model_dir, tmp_path_factory):
    """Calls every action bad, with a reason."""
    return judge_answering("<think>a loop</think><verdict>bad</verdict>", tiny_model_dir,
                           tmp_path_factory.mktemp("pessimist"))


def test_critiques_are_of_the_actions_rightly_called_bad(pessimist_dir):
    """The pessimist calls both actions of a pair bad: right on the bad one (its critiques are
    kept for correction, naming that action), wrong on the good one (nothing to learn from)."""
    model, tokenizer = load_model(pessimist_dir), load_tokenizer(pessimist_dir)
    config = GCDAuxConfig(pairs_per_step=4, group_size=3, sampling={"max_new_tokens": 48, "temperature": 0.0})
    loss = GCDLoss(config, HFSampler(model, tokenizer), tokenizer, seed=0)
    batch = loss.prepare([traj(["start", "A", "B", "A", "C"], success=True)], step=1)  # a0 bad, a4 good
    assert batch.metrics["pairs"] == 2 and batch.metrics["judge_accuracy"] == 0.5
    assert loss.critiques == [("a0", "a loop")] * 3
    # Past max_critiques the oldest go: the newest are what correction summarises.
    loss = GCDLoss(config.model_copy(update={"max_critiques": 4}), HFSampler(model, tokenizer), tokenizer, seed=0)
    loss.critiques = [(f"old {i}", "seen before") for i in range(5)]
    loss.prepare([traj(["start", "A", "B", "A", "C"], success=True)], step=1)
    assert loss.critiques == [("old 4", "seen before")] + [("a0", "a loop")] * 3


def test_correction_summarises_the_newest_critiques(tiny_model_dir, tmp_path):
    """The summary is asked of the last `correction.critiques` critiques, the newest the judge wrote,
    and decoded greedily: the hint is the model's most likely summary, not a draw."""
    from agentrl.gcd.correction import PromptCorrection
    from agentrl.gcd.loss import CorrectionConfig

    class Recording(HFSampler):  # the real sampler, its prompts and settings kept
        def generate(self, prompts, params):
            self.asked = [self.tokenizer.decode(p) for p in prompts]
            self.params = params
            return super().generate(prompts, params)

    tokenizer = load_tokenizer(tiny_model_dir)
    sampler = Recording(load_model(tiny_model_dir), tokenizer)
    sampler.tokenizer = tokenizer
    source = GCDLoss(GCDAuxConfig(), sampler, tokenizer, seed=0)
    source.critiques = [(f"action {i}", f"reason {i}") for i in range(5)]
    correction = PromptCorrection(CorrectionConfig(every=1, critiques=2, max_new_tokens=4), source, sampler,
                                  tokenizer, None, tmp_path / "correction.jsonl")
    correction.refresh(2)
    [asked] = sampler.asked
    assert (sampler.params.temperature, sampler.params.max_new_tokens) == (0.0, 4)
    assert "- action 3: reason 3" in asked and "- action 4: reason 4" in asked
    assert not any(f"action {i}" in asked for i in range(3))
    # every = 2: summarised at steps 1 + k * 2 after the first (3, 5), the hint kept in between.
    log = tmp_path / "every2.jsonl"
    correction = PromptCorrection(CorrectionConfig(every=2, critiques=2, max_new_tokens=4), source, sampler,
                                  tokenizer, None, log)
    for step in range(1, 7):
        correction.refresh(step)
    assert [json.loads(line)["step"] for line in log.read_text().splitlines()] == [3, 5]


def test_a_summary_the_endpoint_fails_to_give_keeps_the_previous_hint(tmp_path):
    """The endpoint down at a refresh: the hint in use stays (for that step too), the failure is
    counted and logged."""
    from types import SimpleNamespace

    from agentrl.gcd.correction import PromptCorrection
    from agentrl.gcd.loss import CorrectionConfig

    down = ChatEndpoint("http://127.0.0.1:9/v1", "x", None, 5, retries=1, backoff_s=0.01)
    source = SimpleNamespace(critiques=[("go to a", "it loops")])
    correction = PromptCorrection(CorrectionConfig(every=1, summarizer="endpoint"), source, None, None, down,
                                  tmp_path / "correction.jsonl")
    correction.hint = "Mistakes to avoid:\n- going round in circles"
    assert correction.refresh(2) == correction.hint == "Mistakes to avoid:\n- going round in circles"
    assert correction.errors == 1
    assert "error" in json.loads((tmp_path / "correction.jsonl").read_text())


@contextmanager
def chat_server(answer, requests: list | None = None):
    """A real chat-completions server on 127.0.0.1: `answer(headers)` is each request's answer text
    (given `n` times), a list of the choices' texts, or None for an HTTP 503; each request's body
    is appended to `requests`."""
    import http.server

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            if requests is not None:
                requests.append(request)
            n = request["n"]
            content = answer(self.headers)
            if content is None:
                self.send_response(503)
                self.end_headers()
                return
            choices = ([{"message": {"content": c}} for c in content] if isinstance(content, list)
                       else [{"message": {"content": content}}] * n)
            body = json.dumps({"choices": choices}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_port}/v1"
    finally:
        server.shutdown()
        server.server_close()


def test_an_endpoint_summary_is_asked_for_at_most_correction_max_new_tokens(tmp_path):
    """The endpoint summarizer is asked, like the policy summarizer, for at most
    `correction.max_new_tokens` tokens, greedily, once a refresh."""
    from types import SimpleNamespace

    from agentrl.gcd.correction import PromptCorrection
    from agentrl.gcd.loss import CorrectionConfig

    requests = []
    with chat_server(lambda headers: "- do not loop", requests) as url:
        endpoint = ChatEndpoint(url, "m", None, 5, retries=0, backoff_s=0.01)
        source = SimpleNamespace(critiques=[("go to a", "it loops")])
        correction = PromptCorrection(CorrectionConfig(every=1, summarizer="endpoint", max_new_tokens=37), source,
                                      None, None, endpoint, tmp_path / "correction.jsonl")
        assert correction.refresh(2) == "Mistakes to avoid:\n- do not loop"
    assert [(r["max_tokens"], r["temperature"], r["n"]) for r in requests] == [(37, 0.0, 1)]


def test_an_empty_summary_gives_no_hint_rather_than_a_bare_header(tmp_path):
    """A summary with nothing in it (the endpoint's empty answer) leaves no hint: a bare "Mistakes
    to avoid:" header would be put before every training prompt for nothing."""
    from types import SimpleNamespace

    from agentrl.gcd.correction import PromptCorrection
    from agentrl.gcd.loss import CorrectionConfig

    source = SimpleNamespace(critiques=[("go to a", "it loops")])
    with chat_server(lambda headers: " \n") as url:
        correction = PromptCorrection(CorrectionConfig(every=1, summarizer="endpoint"), source, None, None,
                                      ChatEndpoint(url, "x", None, 5, retries=0), tmp_path / "correction.jsonl")
        correction.hint = "Mistakes to avoid:\n- going round in circles"
        assert correction.refresh(2) == correction.hint == ""
    with chat_server(lambda headers: "- going round in circles") as url:  # and a summary with something in it is the hint
        correction.endpoint = ChatEndpoint(url, "x", None, 5, retries=0)
        assert correction.refresh(3) == "Mistakes to avoid:\n- going round in circles"


@pytest.fixture(scope="module")
def judge_server(optimist_dir):
    server = make_server(load_model(optimist_dir).eval(), load_tokenizer(optimist_dir))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}/v1"
    server.shutdown()
    server.server_close()


def test_external_judge_over_a_real_http_server(judge_server):
    import urllib.request
    with urllib.request.urlopen(f"{judge_server}/models", timeout=10) as reply:  # what clients probe first
        assert json.loads(reply.read())["data"][0]["object"] == "model"
    endpoint = ChatEndpoint(judge_server, "tiny", "AGENTRL_TEST_KEY", timeout_s=60)
    replies = endpoint.complete("hello", n=5, temperature=1.0, max_tokens=5)
    assert len(replies) == 5 and all(isinstance(r, str) for r in replies)

    steps = [judge_messages([s]) for s in traj(["kitchen", "garden", "hall"]).steps]
    judge = ExternalJudge(endpoint, asks=5, agree=4, temperature=0.0, max_tokens=20)
    assert judge.label(steps) == [True, True, True]
    assert judge.errors == 0 and judge.counts == {"asked": 3, "answers": 15, "parsed": 15, "agreed": 3}
    never = ExternalJudge(endpoint, asks=2, agree=2, temperature=0.0, max_tokens=2)  # cut before the tag
    assert never.label(steps) == [None, None, None]
    assert never.counts == {"asked": 3, "answers": 6, "parsed": 0, "agreed": 0}  # why no step got a label
    split = ExternalJudge(endpoint, asks=3, agree=3, temperature=1.0, max_tokens=20)
    split.label(steps)
    assert split.counts["agreed"] <= 3 and split.counts["parsed"] <= split.counts["answers"] == 9

    down = ExternalJudge(ChatEndpoint("http://127.0.0.1:9/v1", "x", None, 5), 5, 4, 0.0, 8)
    assert down.label(steps) == [None] * 3 and down.errors == 3
    assert down.counts == {"asked": 3, "answers": 0, "parsed": 0, "agreed": 0}
    down.label(steps[:1])
    assert down.errors == 4  # the failed requests over the run, not the last call's


def test_the_endpoint_retries_each_failure_and_sends_its_key(monkeypatch):
    """`retries` failures are retried (retries + 1 attempts), each sending the key named by
    `api_key_env` from the environment; one failure more is an EndpointError that says so."""
    from agentrl.gcd.judge import EndpointError

    seen = []

    def flaky(headers):  # the first two requests of every three fail
        seen.append(headers.get("Authorization"))
        return None if len(seen) % 3 else "<verdict>good</verdict>"

    monkeypatch.setenv("AGENTRL_TEST_KEY", "sk-test")
    with chat_server(flaky) as url:
        endpoint = ChatEndpoint(url, "x", "AGENTRL_TEST_KEY", 5, retries=2, backoff_s=0.0)
        assert endpoint.complete("hi") == ["<verdict>good</verdict>"]
        assert seen == ["Bearer sk-test"] * 3
        with pytest.raises(EndpointError, match=r"\(2 attempts\)"):
            ChatEndpoint(url, "x", "AGENTRL_TEST_KEY", 5, retries=1, backoff_s=0.0).complete("hi")
        assert len(seen) == 5


def test_the_endpoints_backoff_doubles_and_a_reply_without_choices_is_a_failure(monkeypatch):
    """Attempt k waits backoff_s x 2^k before the next; a reply whose choices list is empty is
    retried like any malformed reply, then an EndpointError (not an empty list of answers)."""
    import agentrl.gcd.judge as judge
    from agentrl.gcd.judge import EndpointError

    waits = []
    monkeypatch.setattr(judge.time, "sleep", waits.append)
    with chat_server(lambda headers: None) as url:
        with pytest.raises(EndpointError, match=r"\(4 attempts\)"):
            ChatEndpoint(url, "x", None, 5, retries=3, backoff_s=0.25).complete("hi")
    assert waits == [0.25, 0.5, 1.0]
    waits.clear()
    with chat_server(lambda headers: []) as url:
        with pytest.raises(EndpointError, match="no 'choices' list"):
            ChatEndpoint(url, "x", None, 5, retries=1, backoff_s=0.0).complete("hi")
    assert waits == [0.0]
    # A choice whose content is null (a refusal, say) is an empty answer: text like the others.
    with chat_server(lambda headers: [None, "<verdict>bad</verdict>"]) as url:
        assert ChatEndpoint(url, "x", None, 5).complete("hi", n=2) == ["", "<verdict>bad</verdict>"]


def test_the_external_judge_is_asked_about_the_last_step_it_is_given():
    """Without full history, one user turn: the judged step's own prompt and the question about its
    action (labels send each step's episode up to it)."""
    steps = traj(["kitchen", "garden", "hall"]).steps
    for i in range(len(steps)):
        assert judge_messages(steps[:i + 1]) == [{"role": "user", "content": judge_prompt(steps[i])}]
    assert judge_messages(steps, full_history=True)[-1] == {"role": "user", "content": judge_question(steps[-1])}
    assert len({judge_prompt(s) for s in steps}) == 3


def test_a_critique_is_the_text_inside_the_first_think_that_opens():
    """A stray closing tag before the reasoning does not cut the critique to nothing."""
    from agentrl.gcd.judge import critique

    assert critique("</think> so: <think>it loops back</think><verdict>bad</verdict>") == "it loops back"
    assert critique("<think>first</think> and <think>second</think>") == "first"
    assert critique("no tags <verdict>bad</verdict>") == "no tags"


def test_the_openai_sdk_against_agentrl_serve(judge_server):
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=judge_server, api_key="unused", max_retries=0)
    reply = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], n=2,
                                           max_tokens=4, temperature=1.0)
    assert len(reply.choices) == 2 and all(isinstance(c.message.content, str) for c in reply.choices)
    with pytest.raises(openai.BadRequestError, match="stream=true is not supported"):  # refused, not silent
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], stream=True)


def test_judge_settings_that_cannot_work_are_config_errors():
    """Agreement above the asks; 'llm' labels, or an endpoint summariser, without an endpoint."""
    with pytest.raises(ValueError, match="agree"):
        JudgeEndpointConfig(base_url="http://x", model="m", asks=3, agree=4)
    with pytest.raises(ValueError, match="external"):
        GCDAuxConfig(labels=["rules", "llm"])
    with pytest.raises(ValueError, match="summarizer 'endpoint' needs an `external`"):
        GCDAuxConfig(correction={"summarizer": "endpoint"})
    GCDAuxConfig(correction={"summarizer": "endpoint"}, external={"base_url": "http://x", "model": "m"})


def test_training_with_gcd_logs_judge_metrics_and_correction(tiny_model_dir, tmp_path, judge_server):
    config = validate_config({
        "seed": 5, "run_dir": str(tmp_path / "run"),
        "env": {"type": "household", "max_steps": 4},
        "prompt": {"template": COMPACT, "history_length": 1},
        "sampling": {"max_new_tokens": 8},
        "rl": {"steps": 2, "tasks_per_step": 2, "group_size": 3, "mini_batch_size": 64, "optim": {"lr": 1e-3},
               "aux": [{"type": "gcd", "pairs_per_step": 4, "group_size": 2, "eval_pairs": 4,
                        "sampling": {"max_new_tokens": 6}, "labels": ["llm", "env"],
                        "external": {"base_url": judge_server, "model": "tiny", "asks": 2, "agree": 2,
                                     "pairs_per_step": 2, "max_tokens": 20, "temperature": 0.0},
                        "correction": {"every": 1, "max_new_tokens": 8}}]},
        "eval": {"episodes": 3, "splits": ["l0"]},
    })
    trainer = RLTrainer(config, str(tiny_model_dir), tmp_path / "run")
    try:
        results = trainer.run()
    finally:
        trainer.close()
    rows = read_metrics(tmp_path / "run" / "logs" / "metrics.jsonl")
    for r in rows:  # the optimist labels 2 unlabelled steps good; the environment supplies the bad ones
        assert r["aux/gcd/labels/llm_good"] == 2 and r["aux/gcd/labels/env_bad"] > 0
        assert r["aux/gcd/pairs"] == 4 and r["aux/gcd/labels/llm_errors"] == 0
        assert r["aux/gcd/labels/llm_asked"] == 2 and r["aux/gcd/labels/llm_agreed"] == 2
        assert r["aux/gcd/labels/llm_answers"] == 4 and r["aux/gcd/labels/llm_parsed"] == 4
        assert {"aux/gcd/loss", "aux/gcd/judge_accuracy", "aux/gcd/verdict_parse_rate", "timing_s/aux_prepare"} <= set(r)
    # The random actor's judgments never parse, so there are no critiques and no correction yet.
    assert all(r["aux/gcd/verdict_parse_rate"] == 0 and r["aux/gcd/judge_accuracy"] == 0 for r in rows)
    assert not (tmp_path / "run" / "correction.jsonl").exists()
    assert results["l0"]["episodes"] == 3


def test_classifier_judge_learns_its_labels_through_the_actor(tiny_model_dir):
    from agentrl.actor.single import SingleActor
    from agentrl.config import OptimConfig
    from agentrl.gcd.loss import ClassifierJudgeLoss

    model, tokenizer = load_model(tiny_model_dir), load_tokenizer(tiny_model_dir)
    judge = ClassifierJudgeLoss(gcd_config(judge="classifier"), model, tokenizer, seed=0)
    actor = SingleActor(model, OptimConfig(lr=1e-3), judge.head.parameters())
    t = traj(["start", "A", "B", "A", "C"], success=True)
    samples = judge.prepare([t], step=1).samples
    # The untrained head's logit is 0 (probability 1/2), which calls nothing good: right on the bad
    # pair only.
    for s in samples:
        one = micro_batches([s], 10**6, tokenizer.pad_token_id)[0]
        assert judge.hidden_loss(actor.token_hidden(one), one)[1]["judge_accuracy"] == (s.target[0] == 0.0)
    # Each pair's target is its own step's label: step 0 (into a state seen again) bad, the winning
    # step good; the head reads the judge's prompt for that step.
    from agentrl.gcd.judge import judge_ids
    assert {tuple(s.ids[:-1]): s.target[0] for s in samples} == {
        tuple(judge_ids(tokenizer, t.steps[0])): 0.0, tuple(judge_ids(tokenizer, t.steps[4])): 1.0}
    assert all(s.n_targets == 1 for s in samples)

    def loss_fn(batch):
        loss, counts = judge.hidden_loss(actor.token_hidden(batch), batch)
        return LossOutputs(loss.sum() / len(samples), counts=counts)

    before = [p.detach().clone() for p in model.parameters()]
    batches = micro_batches(samples, 10**6, tokenizer.pad_token_id)
    for _ in range(60):
        metrics = actor.optimizer_step([(batches, loss_fn)])
    assert metrics.counts["judge_accuracy"] == 2  # both pairs judged right
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))  # the body learns too
    assert judge.evaluate([t], seed=0)["judge_accuracy"] == 1.0


def test_classifier_judge_trains_in_the_loop_and_resumes_exactly(tiny_model_dir, tmp_path, judge_server):
    def config(run_dir, steps):
        return validate_config({
            "seed": 5, "run_dir": str(run_dir),
            "env": {"type": "household", "max_steps": 4},
            "prompt": {"template": COMPACT, "history_length": 1},
            "sampling": {"max_new_tokens": 8},
            "rl": {"steps": steps, "tasks_per_step": 2, "group_size": 3, "mini_batch_size": 64,
                   "optim": {"lr": 1e-3}, "save_every": 1,
                   "aux": [{"type": "gcd", "judge": "classifier", "pairs_per_step": 4, "eval_pairs": 4,
                            "labels": ["llm", "env"],
                            "external": {"base_url": judge_server, "model": "tiny", "asks": 2, "agree": 2,
                                         "pairs_per_step": 2, "max_tokens": 20, "temperature": 0.0}}]},
            "eval": {"episodes": 2, "splits": ["l0"]},
        })

    def run(cfg, resume=False):
        trainer = RLTrainer(cfg, str(tiny_model_dir), tmp_path / cfg.run_dir)
        try:
            return trainer.run(resume=resume)
        finally:
            trainer.close()

    from safetensors.torch import load_file

    from agentrl.checkpoint import list_checkpoints

    results = run(config(tmp_path / "a", 2))
    rows = read_metrics(tmp_path / "a" / "logs" / "metrics.jsonl")
    assert all(r["aux/gcd/pairs"] == 4 and 0 <= r["aux/gcd/judge_accuracy"] <= 1 for r in rows)
    assert results["l0"]["episodes"] == 2
    run(config(tmp_path / "b", 1))
    run(config(tmp_path / "b", 2), resume=True)
    head_a = load_file(list_checkpoints(tmp_path / "a")[-1] / "gcd" / "head.safetensors")
    head_b = load_file(list_checkpoints(tmp_path / "b")[-1] / "gcd" / "head.safetensors")
    assert head_a["weight"].abs().sum() > 0
    assert all(torch.equal(head_a[k], head_b[k]) for k in head_a)


def test_classifier_has_no_critiques_for_correction():
    with pytest.raises(ValueError, match="generative"):
        GCDAuxConfig(judge="classifier", correction={"every": 1})


def test_judgment_rewards_and_advantages_by_hand():
    from agentrl.gcd.loss import group_advantages, judgment_reward

    assert [judgment_reward(v, True) for v in (True, False, None)] == [1.0, 0.0, 0.0]
    assert [judgment_reward(v, False) for v in (True, False, None)] == [0.0, 1.0, 0.0]
    # Rewards [1, 0, 0]: mean 1/3, population std sqrt(2)/3 -> (2/3) / 0.4714 = 1.41421, -0.70711.
    assert group_advantages([1.0, 0.0, 0.0]) == pytest.approx([1.41421, -0.70711, -0.70711], abs=1e-5)
    assert group_advantages([1.0, 1.0]) == [0.0, 0.0]


def test_an_always_good_judge_scores_half_on_balanced_pairs(optimist_dir):
    """The optimist answers "good" to everything: right on the good pair, wrong on the bad one,
    and every group agrees with itself, so no judgment gets an advantage."""
    model, tokenizer = load_model(optimist_dir), load_tokenizer(optimist_dir)
    config = GCDAuxConfig(pairs_per_step=4, group_size=3, sampling={"max_new_tokens": 20, "temperature": 0.0})
    loss = GCDLoss(config, HFSampler(model, tokenizer), tokenizer, seed=0)
    batch = loss.prepare([traj(["start", "A", "B", "A", "C"], success=True)], step=1)
    assert batch.metrics["pairs"] == 2
    assert batch.metrics["judge_accuracy"] == 0.5 and batch.metrics["verdict_parse_rate"] == 1.0
    assert all(a == 0.0 for s in batch.samples for a in s.advantages)
    # It rightly called nothing bad, so there is nothing to critique.
    assert loss.critiques == []
    evaluated = loss.evaluate([traj(["start", "A", "B", "A", "C"], success=True)], seed=0)
    assert evaluated == {"judge_accuracy": 0.5, "verdict_parse_rate": 1.0, "judge_pairs": 2}
    # Evaluation is greedy whatever the training judgments' temperature: at 50 they would be noise.
    hot = GCDLoss(config.model_copy(update={"sampling": config.sampling.model_copy(update={"temperature": 50.0})}),
                  HFSampler(model, tokenizer), tokenizer, seed=0)
    assert hot.evaluate([traj(["start", "A", "B", "A", "C"], success=True)], seed=0) == evaluated


def test_the_external_judges_counts_are_each_steps_own(tiny_model_dir, judge_server):
    """A step that leaves the external judge nothing to label (the rules label every step) logs
    no asks, not the previous step's."""
    from agentrl.gcd.loss import select_pairs

    tokenizer = load_tokenizer(tiny_model_dir)
    config = GCDAuxConfig(pairs_per_step=2, labels=["rules", "llm"],
                          external={"base_url": judge_server, "model": "tiny", "asks": 2, "agree": 2,
                                    "pairs_per_step": 2})
    judge = GCDLoss(config, HFSampler(load_model(tiny_model_dir), tokenizer), tokenizer, seed=0,
                    external=ExternalJudge(ChatEndpoint(judge_server, "tiny", None, 60), 2, 2, 0.0, 20))
    _, metrics = select_pairs(judge, [traj(["start", "A", "B", "A", "C"], success=True)], 1)
    assert metrics["labels/llm_asked"] == 2 and metrics["labels/llm_answers"] == 4  # 2 of steps 1-3
    _, metrics = select_pairs(judge, [traj(["start"], success=True)], 2)  # its one step labelled by the rules
    assert {k: v for k, v in metrics.items() if k.startswith("labels/llm_")} == {
        "labels/llm_errors": 0.0, "labels/llm_asked": 0.0, "labels/llm_answers": 0.0, "labels/llm_parsed": 0.0,
        "labels/llm_agreed": 0.0}


def test_each_step_judges_its_own_draw_of_pairs(tiny_model_dir):
    """With more labelled steps than pairs_per_step, the pairs judged are drawn afresh every step
    (seeded by the step), not the same few every step."""
    from agentrl.gcd.loss import select_pairs

    tokenizer = load_tokenizer(tiny_model_dir)
    judge = GCDLoss(GCDAuxConfig(pairs_per_step=2), HFSampler(load_model(tiny_model_dir), tokenizer), tokenizer, seed=0)
    episodes = [traj([f"s{k}", f"A{k}", f"B{k}", f"A{k}", f"C{k}"], success=True) for k in range(6)]
    drawn = [tuple(x.step.prompt for x in select_pairs(judge, episodes, step)[0]) for step in range(1, 5)]
    assert all(len(d) == 2 for d in drawn) and len(set(drawn)) > 1
    assert drawn == [tuple(x.step.prompt for x in select_pairs(judge, episodes, step)[0]) for step in range(1, 5)]


def test_labels_per_source_on_a_hand_built_trajectory(judge_server):
    """rules first (steps 0 and 4), then the external judge on what is left (the optimist:
    good), and the environment's progress flags only where neither labelled."""
    t = traj(["start", "A", "B", "A", "C"], success=True, progress=[True, None, False, True, True])
    external = ExternalJudge(ChatEndpoint(judge_server, "tiny", None, 60), 2, 2, 0.0, 20)
    labelled = label_steps([t], ["rules", "llm", "env"], external, external_budget=2, rng=random.Random(0))
    by_step = {x.step.action: (x.label, x.source) for x in labelled}
    llm = [a for a, (_, source) in by_step.items() if source == "llm"]
    assert by_step["a0"] == (False, "rules") and by_step["a4"] == (True, "rules")
    assert len(llm) == 2 and all(by_step[a] == (True, "llm") for a in llm)
    left = ({"a1", "a2", "a3"} - set(llm)).pop()
    assert by_step.get(left) == {"a1": None, "a2": (False, "env"), "a3": (True, "env")}[left]
    # A judge that gives no verdict (cut before its tag) labels nothing: the next source decides.
    mute = ExternalJudge(ChatEndpoint(judge_server, "tiny", None, 60), 2, 2, 0.0, 2)
    unanswered = label_steps([t], ["rules", "llm", "env"], mute, external_budget=3, rng=random.Random(0))
    assert {x.step.action: (x.label, x.source) for x in unanswered} == {
        "a0": (False, "rules"), "a2": (False, "env"), "a3": (True, "env"), "a4": (True, "rules")}


def test_correction_hint_is_in_training_prompts_after_a_refresh_and_never_in_evaluation(choice_model_dir, tmp_path):
    import twostep

    from agentrl.evaluate import evaluate
    from agentrl.gcd.correction import HEADER

    config = twostep.config(tmp_path, aux=[{"type": "gcd", "pairs_per_step": 2, "group_size": 2,
                                            "sampling": {"max_new_tokens": 6},
                                            "correction": {"every": 1, "max_new_tokens": 12}}])
    trainer = RLTrainer(config, str(choice_model_dir), tmp_path)
    try:
        assert all(not s.prompt.startswith(HEADER) for t in trainer.rollout(1) for s in t.steps)
        trainer.component("gcd").critiques = [("open cabinet 1", "it leads to the cellar")]
        trained = trainer.rollout(2)  # step 2 refreshes the summary (every 1 step)
        evaluate(trainer.pool, trainer.sampler, trainer.tokenizer, config.eval, config.prompt, config.seed,
                 tmp_path / "eval")
    finally:
        trainer.close()
    hint = trainer.component("gcd").correction.hint
    assert hint.startswith(HEADER) and len(hint) > len(HEADER)
    assert all(s.prompt.startswith(hint + "\n") for t in trained for s in t.steps)
    logged = [json.loads(line) for line in (tmp_path / "correction.jsonl").read_text().splitlines()]
    assert logged == [{"step": 2, "critiques": 1, "hint": hint}]
    evaluated = [json.loads(line) for line in (tmp_path / "eval" / "trajectories_l0.jsonl").read_text().splitlines()]
    assert evaluated and all(HEADER not in s["prompt"] for t in evaluated for s in t["steps"])


class RuleJudge:
    """A rule judge as the sampler: it calls the step taken from "state start" bad (with a reason)
    and every other step good, whatever else its prompt holds."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def generate(self, prompts, sampling):
        from agentrl.sampler.base import Generation

        replies = ["<think>it loops</think><verdict>bad</verdict>" if "state start" in self.tokenizer.decode(p)
                   else "<verdict>good</verdict>" for p in prompts]
        return [Generation(self.tokenizer(r).input_ids, [0.0] * len(self.tokenizer(r).input_ids)) for r in replies]


def test_each_group_judges_its_own_step_and_a_critique_names_the_action(tiny_model_dir):
    """group_size judgments of each pair's step are read as that step's group (a judge right on
    every step scores 1.0), and a critique names the action taken, not the whole reply."""
    tokenizer = load_tokenizer(tiny_model_dir)
    t = traj(["start", "A", "B", "A", "C"], success=True)  # a0 bad (leads back), a4 good (wins)
    for s in t.steps:
        s.response = f"<think>go</think><action>{s.action}</action>"
    loss = GCDLoss(gcd_config(), RuleJudge(tokenizer), tokenizer, seed=0)
    batch = loss.prepare([t], step=1)
    assert batch.metrics["pairs"] == 2 and batch.metrics["judge_accuracy"] == 1.0
    assert loss.critiques == [("a0", "it loops")] * 3


def test_critiques_and_the_correction_hint_survive_a_resume(tiny_model_dir, tmp_path):
    from agentrl.gcd.loss import CorrectionConfig

    tokenizer = load_tokenizer(tiny_model_dir)
    config = GCDAuxConfig(correction=CorrectionConfig(every=2))
    loss = GCDLoss(config, RuleJudge(tokenizer), tokenizer, seed=0, run_dir=tmp_path)
    loss.critiques = [("go to a", "it loops"), ("open b", "it cannot help")]
    loss.correction.hint = "Mistakes to avoid:\n- looping"
    resumed = GCDLoss(config, RuleJudge(tokenizer), tokenizer, seed=0, run_dir=tmp_path)
    resumed.load_state(json.loads(json.dumps(loss.state())))  # as a checkpoint keeps it
    assert resumed.critiques == loss.critiques and resumed.hint(2) == "Mistakes to avoid:\n- looping"
