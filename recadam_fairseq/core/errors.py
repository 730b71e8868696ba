"""The plug-in's own error type: a mistake in the user's input, reported as one line.

Every check of the plug-in raises :class:`ConfigError` (or a subclass) with a message that names
the flag, file or parameter at fault. When fairseq loads the user-dir, ``plumbing/errors_hook.py`` installs
an exception hook that prints these as ``<program>: error: <message>`` without a traceback; every
other exception keeps its traceback. A ValueError, so ``except ValueError`` still catches it.
"""


class ConfigError(ValueError):
    """Bad input (a flag, a file, a parameter), found before training starts."""
