"""Errors the harness raises, each saying what to do next."""


class FheError(RuntimeError):
    """The work failed (the CLI exits 1); every error of the toolkit derives from it."""


class NotCompiledError(FheError):
    pass


class KeysMissingError(FheError):
    pass


class InputOverflowError(FheError):
    """An input would push a value past the bit width calibration fixed: the encrypted circuit would
    wrap around where the clear program saturates, so the client refuses to encrypt it."""


class SecretKeyLeakError(FheError):
    """A server-side object would hold a secret key."""


class BadOptionError(FheError):
    """The options or files given cannot work as asked (the CLI's usage errors: exit status 2)."""
