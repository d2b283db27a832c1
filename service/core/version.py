"""The package's version (what the OpenAPI document and the OIP server metadata report)."""

__version__ = "0.1.0"
