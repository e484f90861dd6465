"""safetensors.torch.load_file as hf-check.py uses it, by torch_hf_llama.py's reader."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
from torch_hf_llama import read_file as load_file  # noqa: E402,F401
