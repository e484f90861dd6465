"""Stand-in for the safetensors package (see ../transformers/__init__.py)."""
