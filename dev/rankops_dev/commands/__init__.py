"""The `rankops dev ...` command lines. The product's `rankops` finds them through the
`rankops.commands` entry point this distribution registers (dev/pyproject.toml)."""
