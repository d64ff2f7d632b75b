"""levers9: the client SDK and the CLI."""

__version__ = "0.1.0"
