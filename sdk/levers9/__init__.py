"""levers9: the client SDK and the CLI.

`from levers9 import App, Image, Secret` must work inside a container, where this folder is mounted
alone on a bare python3: this module, levers9.app and levers9.options import the standard library only.
"""

__version__ = "0.1.0"

from levers9.app import App, ConfigError, Image, Secret, load_app_file

__all__ = ["App", "ConfigError", "Image", "Secret", "load_app_file", "__version__"]
