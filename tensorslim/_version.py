"""The version of tensorslim, in one place (read by pyproject.toml and re-exported as ``tensorslim.__version__``)."""

__version__ = "0.2.0"
