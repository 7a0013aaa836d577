"""GCD (generative classification disentanglement): the actor co-trained as a judge of its own
actions, all in this package. `loss` is the auxiliary loss (`rl.aux: [{type: gcd}]`: its config,
the GRPO loss on judgments, the classifier ablation, the prompt-correction hint), `labels` says
which actions were good or bad, `judge` builds judge prompts and parses verdicts (and asks an
external LLM judge), `correction` turns critiques into prompt guidance, and `data` makes the
judgment examples of the SFT cold start (`sft.judgments`)."""
