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
