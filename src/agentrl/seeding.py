"""Randomness derived from (seed, step, purpose): a resumed run draws exactly what an uninterrupted
one would have drawn at the same step."""

from __future__ import annotations

import random


def step_seed(seed: int, step: int, purpose: str) -> int:
    return random.Random(f"{seed}:{step}:{purpose}").getrandbits(63)
