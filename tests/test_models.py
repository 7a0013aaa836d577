import pytest
from transformers import AutoConfig, AutoTokenizer

from agentrl.models import load_tokenizer


def test_tiny_tokenizer_survives_reload(tiny_model_dir):
    """The transformers 5.x trap: AutoTokenizer rebuilds Qwen2's pipeline on load."""
    tokenizer = load_tokenizer(tiny_model_dir)
    reloaded = AutoTokenizer.from_pretrained(tiny_model_dir)
    text = ("<|im_start|>user\nTask: put a hot egg in shelf.\nActions: go to cabinet 12, look<|im_end|>\n"
            "<|im_start|>assistant\n<think>I search for the egg.</think><action>go to shelf 1</action>"
            "<|im_end|> unseen wörds 123 ")
    ids = tokenizer(text, add_special_tokens=False).input_ids
    assert ids == reloaded(text, add_special_tokens=False).input_ids
    assert tokenizer.decode(ids) == text
    assert tokenizer.convert_tokens_to_ids("<|im_start|>") in ids
    assert ids.count(tokenizer.eos_token_id) == 2


def test_tiny_model_config(tiny_model_dir):
    config = AutoConfig.from_pretrained(tiny_model_dir)
    assert config.model_type == "qwen2"
    assert config.hidden_size // config.num_attention_heads == 64
    assert config.vocab_size == len(load_tokenizer(tiny_model_dir))


def test_a_tokenizer_from_a_chat_dataset_plays_no_episode(tmp_path):
    """`init.corpus`: the tokenizer learns the dataset's text (its words become single tokens)
    and no expert episode is played (the environment is never asked for one)."""
    import json

    from agentrl.config import PromptConfig, TinyModelConfig
    from agentrl.models import init_tiny_model

    class NoEpisodes:
        def split_tasks(self, split):
            raise AssertionError("the corpus file replaces the expert episodes")

    line = {"messages": [{"role": "user", "content": "zorblat quaxen " * 50},
                         {"role": "assistant", "content": "<action>zorblat</action>"}]}
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text(json.dumps(line) + "\n")
    out = init_tiny_model(tmp_path / "model", TinyModelConfig(layers=1, vocab_size=300, corpus=str(corpus)),
                          NoEpisodes(), PromptConfig())
    tokenizer = load_tokenizer(out)
    assert len(tokenizer(" zorblat", add_special_tokens=False).input_ids) == 1
    assert len(tokenizer(" qwertyx", add_special_tokens=False).input_ids) > 1  # never seen


def test_the_tiny_model_takes_the_context_length_asked_for(tmp_path):
    """`init.context_length` is the saved model's `max_position_embeddings` (a full-history
    episode is one sequence), 4096 when unset as before it existed."""
    import json

    from agentrl.config import PromptConfig, TinyModelConfig
    from agentrl.models import init_tiny_model

    line = {"messages": [{"role": "user", "content": "go to desk 1 " * 20},
                         {"role": "assistant", "content": "<action>look</action>"}]}
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text(json.dumps(line) + "\n")
    for asked, expected in [({"context_length": 8192}, 8192), ({}, 4096)]:
        out = init_tiny_model(tmp_path / f"model{expected}", TinyModelConfig(layers=1, vocab_size=300, corpus=str(corpus),
                                                                              **asked), None, PromptConfig())
        assert json.loads((out / "config.json").read_text())["max_position_embeddings"] == expected


def test_a_full_history_tokenizer_corpus_holds_every_turn_once():
    """The tokenizer learns each step's own text: with `prompt.full_history` the later turns'
    observations (not only the episode's first prompt, repeated), as the window's prompts do."""
    from agentrl.config import PromptConfig
    from agentrl.envs import make_env
    from agentrl.envs.household.env import HouseholdEnvConfig
    from agentrl.models import environment_corpus

    env = make_env(HouseholdEnvConfig())
    window = environment_corpus(env, PromptConfig(), 4, seed=0)
    full = environment_corpus(env, PromptConfig(full_history=True), 4, seed=0)
    assert len(full) == len(window)  # a prompt and a reply a step, the same expert moves
    assert full[1::2] == window[1::2]
    turns = [text for text in full[0::2] if text.startswith("Observation: ")]
    assert len(turns) == len(full) // 2 - 4  # every step after each episode's first
    assert len(set(full[0::2])) == len(full) // 2
    # Its episodes cycle over every split: L2's held-out task types (cool, pick-two) are in it too.
    assert any("put two " in text or "put a cool " in text for text in window)


def test_bf16_is_slow_only_on_a_cpu_without_its_instructions():
    from agentrl.models import slow_dtype
    why = slow_dtype("bfloat16", cuda=False, native_bf16=False)
    assert why.startswith("model.dtype bfloat16:") and "model.dtype=float32" in why
    assert slow_dtype("bfloat16", cuda=False, native_bf16=True) is None
    assert slow_dtype("bfloat16", cuda=True, native_bf16=False) is None  # a GPU computes it
    assert slow_dtype("float32", cuda=False, native_bf16=False) is None


def test_a_checkpoint_saved_in_several_files_is_read_from_all_of_them(tiny_model_dir, tmp_path):
    """`load_shards` (how a sharded actor fills a model loaded empty) on a folder whose weights
    are split over several safetensors files by its index: every parameter is the file's."""
    import torch

    from agentrl.models import load_model, load_shards

    model = load_model(str(tiny_model_dir))
    model.save_pretrained(tmp_path / "split", max_shard_size="400KB")
    files = sorted(p.name for p in (tmp_path / "split").glob("*.safetensors"))
    assert len(files) > 2 and "model.safetensors" not in files
    empty = load_model(str(tmp_path / "split"), empty=True)
    empty.to_empty(device="cpu")
    empty.tie_weights()  # (to_empty gives the shared head a tensor of its own)
    load_shards(empty, tmp_path / "split")
    expected = dict(model.named_parameters())
    for name, param in empty.named_parameters():
        assert torch.equal(param, expected[name]), name


def test_the_tokenizer_learns_bytes_it_never_saw_and_words_as_normalised():
    """Any text round-trips (the byte alphabet is in the vocabulary from the start, not only the
    corpus's bytes), and a word the corpus wrote in decomposed Unicode is learnt as the composed
    form the tokenizer encodes (NFC at training as at encoding)."""
    from agentrl.models import train_tokenizer

    tokenizer = train_tokenizer(["go to desk 1, take mug 2 from desk 1, cafe\u0301 cafe\u0301"] * 30, 300)
    text = "Zürich → 🙂 QXJ"
    assert tokenizer.decode(tokenizer(text, add_special_tokens=False).input_ids) == text
    assert len(tokenizer(" café", add_special_tokens=False).input_ids) == 1


def test_a_tokenizer_without_a_pad_token_pads_with_its_end_token(tiny_model_dir, tmp_path):
    import shutil

    shutil.copy(f"{tiny_model_dir}/config.json", tmp_path / "config.json")
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    tokenizer.pad_token = None
    tokenizer.save_pretrained(tmp_path)
    assert AutoTokenizer.from_pretrained(tmp_path).pad_token is None
    loaded = load_tokenizer(str(tmp_path))
    assert loaded.pad_token == loaded.eos_token == "<|im_end|>"


@pytest.mark.parametrize("offline,reachable", [(None, True), ("0", True), ("false", True), ("1", False),
                                               ("true", False), ("True", False), ("yes", False)])
def test_hf_hub_offline_is_honoured_in_every_spelling(monkeypatch, offline, reachable):
    """The hub's own switch, as huggingface_hub reads it: anything but unset, 0 or false is
    offline, even with a hub answering (here a real listening socket on 127.0.0.1)."""
    import socket

    from agentrl.models import hub_reachable

    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{server.getsockname()[1]}")
        if offline is None:
            monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
        else:
            monkeypatch.setenv("HF_HUB_OFFLINE", offline)
        assert hub_reachable() is reachable
