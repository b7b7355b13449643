"""Errors the harness raises, each saying what to do next."""


class FheError(RuntimeError):
    pass


class NotCompiledError(FheError):
    pass


class KeysMissingError(FheError):
    pass
