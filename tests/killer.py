"""Test helper: run the `agentrl` CLI and SIGKILL the process in the middle of the N-th file
write whose path contains PATTERN (`Path.write_text` half written, a safetensors file half
written, or just before an `os.replace`). Prints the writes it saw on a normal exit.

    python tests/killer.py PATTERN@N run recipe.yaml      # e.g. sft/model@1
"""

import os
import pathlib
import signal
import sys

import safetensors.torch

pattern, _, count = sys.argv[1].rpartition("@")
target, seen, writes = int(count), [0], [0]


def reached(*paths) -> bool:
    writes[0] += 1
    if any(pattern in str(p) for p in paths):
        seen[0] += 1
        return seen[0] == target
    return False


def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


save_file, write_text, replace = safetensors.torch.save_file, pathlib.Path.write_text, os.replace


def killing_save_file(tensors, filename, metadata=None):
    if reached(filename):
        pathlib.Path(filename).write_bytes(b"half a safetensors file")
        die()
    return save_file(tensors, filename, metadata)


def killing_write_text(self, data, *args, **kwargs):
    if reached(self):
        write_text(self, data[:len(data) // 2], *args, **kwargs)
        die()
    return write_text(self, data, *args, **kwargs)


def killing_replace(src, dst, *args, **kwargs):
    if reached(src, dst):
        die()
    return replace(src, dst, *args, **kwargs)


safetensors.torch.save_file, pathlib.Path.write_text, os.replace = killing_save_file, killing_write_text, killing_replace

from agentrl.cli import main  # noqa: E402  (after the patches, so transformers imports the patched save_file)

code = main(sys.argv[2:])
print(f"writes: {writes[0]}", file=sys.stderr)
sys.exit(code)
