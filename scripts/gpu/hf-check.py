#!/usr/bin/env python3
"""On the GPU machine (torch + transformers): loads a Hugging Face export made by
`mtnlg checkpoint export` (GPT2LMHeadModel, LlamaForCausalLM, Qwen2ForCausalLM or
Qwen3ForCausalLM, as its config.json's `architectures` says) with transformers' own class on the GPU in fp32,
computes the logits of the tokens in REF (written by `mtnlg checkpoint logits`) and
compares them with mtnlg's.

  usage: hf-check.py HF_DIR REF.safetensors [BOUND]     (BOUND default 1e-3)

Prints the worst |hf - mtnlg| / max |mtnlg| and exits 0 when it is within BOUND. A
transformers too old to know the class (Qwen3 came with 4.51) is said ("NOT CHECKED",
naming the version) and exits 0: the proof's other checks still count."""
import json
import sys

import torch
import transformers
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM


def main(hf_dir, ref_path, bound=1e-3):
    ref = load_file(ref_path)
    tokens, logits = ref["tokens"].long(), ref["logits"].float()
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    arch = json.load(open(f"{hf_dir}/config.json"))["architectures"][0]
    if not hasattr(transformers, arch):
        print(f"hf-check: NOT CHECKED: transformers {transformers.__version__} has no {arch}")
        return 0
    # The class config.json names (AutoModelForCausalLM maps model_type to it), in fp32 with
    # the plain attention (no fused kernel that might compute in lower precision).
    model = AutoModelForCausalLM.from_pretrained(hf_dir, torch_dtype=torch.float32, attn_implementation="eager")
    assert type(model).__name__ == arch, f"transformers built {type(model).__name__}, config.json names {arch}"
    model = model.to(dev).eval()
    torch.backends.cuda.matmul.allow_tf32 = False  # fp32 GEMMs, as mtnlg's
    torch.backends.cudnn.allow_tf32 = False
    with torch.no_grad():
        hf = model(tokens.to(dev)).logits.float().cpu()
    hf = hf[..., : logits.shape[-1]]
    err = ((hf - logits).abs().max() / logits.abs().max()).item()
    agree = (hf.argmax(-1) == logits.argmax(-1)).float().mean().item()
    print(f"hf-check: {arch}, {tokens.shape[1]} tokens on {dev}: worst |hf - mtnlg| / max|mtnlg| = {err:.3e} "
          f"(bound {bound:g}); argmax agreement {100 * agree:.1f}%")
    print("PASS" if err <= bound else "FAIL")
    return 0 if err <= bound else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2], float(sys.argv[3]) if len(sys.argv) > 3 else 1e-3))
