"""GCD (generative classification disentanglement): the actor co-trained as a judge of its own
actions. `labels` says which actions were good or bad, `judge` builds judge prompts and parses
verdicts (and asks an external LLM judge), `correction` turns critiques into prompt guidance; the
loss itself is `agentrl.losses.gcd.GCDLoss`."""
