"""The errors the CLI reports in one line, without a traceback."""


class ConfigError(ValueError):
    """Wrong input from the user (a recipe, an override, a path, a model): the CLI exits 2 with its
    message, which names the file and field. Raised as `agentrl.config.ConfigError` too."""


class RunError(RuntimeError):
    """A run that cannot go on (most episodes aborting, workers that die on start, updates that
    stay non-finite). Its message names the cause; the CLI prints it without a traceback and
    exits 1."""
