"""Errors of the command line (a module of its own, so `python -m omru.cli.main`
and `omru.cli.main` share one class)."""


class CliError(Exception):
    """Bad input from the user: printed as one line, exit code 2."""
