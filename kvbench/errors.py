"""The one exception type that means "the user asked for something invalid"."""


class ConfigError(ValueError):
    """Bad input: a config value, a plugin name, a trace row.

    The message is one line that names the key, the value and what is allowed; the CLI prints it
    without a traceback and exits non-zero.
    """
