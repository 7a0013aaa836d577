"""Prompt-based correction: critiques of bad actions -> a short list of mistakes to avoid.

Every `every` training steps the most recent critiques the judge wrote about actions it rightly
called bad are summarised (by the actor itself or by the external endpoint) and the summary is
prepended to the actor's training prompts until the next refresh. Evaluation never sees it. Each
refresh is appended to <run_dir>/correction.jsonl so a user can read what was injected when.
"""

from __future__ import annotations

import json
from pathlib import Path

from agentrl.config import SamplingConfig
from agentrl.gcd.judge import EndpointError
from agentrl.prompting import encode_prompt

SUMMARY_PROMPT = ("An agent made these mistakes while doing household tasks:\n{critiques}\n"
                  "Summarise them as a short list of mistakes to avoid, one per line.")
HEADER = "Mistakes to avoid:"


class PromptCorrection:
    def __init__(self, config, critiques_source, sampler, tokenizer, endpoint, log_path: Path):
        self.config, self.source = config, critiques_source
        self.sampler, self.tokenizer, self.endpoint = sampler, tokenizer, endpoint
        self.log_path = Path(log_path)
        self.hint = ""
        self.errors = 0
        """Summaries the endpoint failed to give (after its retries)."""

    def refresh(self, step: int) -> str:
        """The hint for training step `step` (1-based); recomputed at steps 1 + k * every."""
        if (step - 1) % self.config.every or step == 1:
            return self.hint
        recent = self.source.critiques[-self.config.critiques:]
        if not recent:
            return self.hint
        listing = "\n".join(f"- {action}: {text}" for action, text in recent)
        prompt = SUMMARY_PROMPT.format(critiques=listing)
        if self.config.summarizer == "endpoint":
            try:
                summary = self.endpoint.complete(prompt, 1, 0.0, self.config.max_new_tokens)[0]
            except EndpointError as error:  # the previous hint stays until the next refresh
                self.errors += 1
                with self.log_path.open("a") as f:
                    f.write(json.dumps({"step": step, "critiques": len(recent), "error": str(error)}) + "\n")
                return self.hint
        else:
            params = SamplingConfig(temperature=0.0, max_new_tokens=self.config.max_new_tokens)
            generation = self.sampler.generate([encode_prompt(self.tokenizer, prompt)], params)[0]
            summary = self.tokenizer.decode(generation.token_ids, skip_special_tokens=True)
        self.hint = f"{HEADER}\n{summary.strip()}" if summary.strip() else ""
        with self.log_path.open("a") as f:
            f.write(json.dumps({"step": step, "critiques": len(recent), "hint": self.hint}) + "\n")
        return self.hint
