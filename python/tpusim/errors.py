"""What tpusim raises and warns: bad input is a ConfigError, as the CLI's exit code 2.

Example:
    try:
        tpusim.estimate({"model_name": "llama3.1-8b", "compile_topology": "v5p-7"})
    except tpusim.ConfigError as error:
        error.key      # 'compile_topology' (None when the message names no single key)
        str(error)     # the message the CLI prints after "tpusim: "
"""


class ConfigError(ValueError):
    """Bad input: an unknown key, a wrong value, an impossible mesh, a malformed file.

    `message` is the CLI's message (its --json error object's "error"), `key` the config key or
    option it is about (its "key"), or None.
    """

    def __init__(self, message, key=None):
        super().__init__(message, key)
        self.message = message
        self.key = key

    def __str__(self):
        return self.message


class NotModeledWarning(UserWarning):
    """MaxText keys set off MaxText's default that tpusim does not model (the estimate ignores
    them); the CLI prints the same warning on stderr."""
