"""Subcommands of ``probe`` beyond the core ones, one module each (see probe.cli)."""
