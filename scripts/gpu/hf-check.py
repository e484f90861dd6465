#!/usr/bin/env python3
"""On the GPU machine (torch + transformers): loads a Hugging Face GPT-2 export made by
`mtnlg checkpoint export --format hf-gpt2` with transformers' own GPT2LMHeadModel on the
GPU in fp32, computes the logits of the tokens in REF (written by `mtnlg checkpoint
logits`) and compares them with mtnlg's.

  usage: hf-check.py HF_DIR REF.safetensors [BOUND]     (BOUND default 1e-3)

Prints the worst |hf - mtnlg| / max |mtnlg| and exits 0 when it is within BOUND."""
import sys

import torch
from safetensors.torch import load_file
from transformers import GPT2LMHeadModel


def main(hf_dir, ref_path, bound=1e-3):
    ref = load_file(ref_path)
    tokens, logits = ref["tokens"].long(), ref["logits"].float()
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    model = GPT2LMHeadModel.from_pretrained(hf_dir, torch_dtype=torch.float32).to(dev).eval()
    torch.backends.cuda.matmul.allow_tf32 = False  # fp32 GEMMs, as mtnlg's
    torch.backends.cudnn.allow_tf32 = False
    with torch.no_grad():
        hf = model(tokens.to(dev)).logits.float().cpu()
    hf = hf[..., : logits.shape[-1]]
    err = ((hf - logits).abs().max() / logits.abs().max()).item()
    agree = (hf.argmax(-1) == logits.argmax(-1)).float().mean().item()
    print(f"hf-check: {tokens.shape[1]} tokens on {dev}: worst |hf - mtnlg| / max|mtnlg| = {err:.3e} "
          f"(bound {bound:g}); argmax agreement {100 * agree:.1f}%")
    print("PASS" if err <= bound else "FAIL")
    return 0 if err <= bound else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2], float(sys.argv[3]) if len(sys.argv) > 3 else 1e-3))
