"""Errors of a run (as opposed to `agentrl.config.ConfigError`, errors of its input)."""


class RunError(RuntimeError):
    """A run that cannot go on (most episodes aborting, workers that die on start, updates that
    stay non-finite). Its message names the cause; the CLI prints it without a traceback and
    exits 1."""
