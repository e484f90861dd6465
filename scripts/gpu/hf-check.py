#!/usr/bin/env python3
"""On the GPU machine (torch + transformers): loads a Hugging Face export made by
`mtnlg checkpoint export` (GPT2LMHeadModel, LlamaForCausalLM, Qwen2ForCausalLM or
Qwen3ForCausalLM, as its config.json's `architectures` says) with transformers' own class on the GPU in fp32,
computes the logits of the tokens in REF (written by `mtnlg checkpoint logits`) and
compares them with mtnlg's.

  usage: hf-check.py HF_DIR REF.safetensors [BOUND]     (BOUND default 1e-3)
         hf-check.py --moe MTNLG OUT_DIR [BOUND]

Prints the worst |hf - mtnlg| / max |mtnlg| and exits 0 when it is within BOUND. A
transformers too old to know the class (Qwen3 came with 4.51) is said ("NOT CHECKED",
naming the version) and exits 0: the proof's other checks still count.

--moe: the other direction, for the mixture-of-experts classes. Tiny random
MixtralForCausalLM, Qwen2MoeForCausalLM (a gated shared expert, a dense layer, top-k not
renormalised) and Qwen3MoeForCausalLM (a dense layer) are built with transformers' own
classes and saved (save_pretrained: whatever expert layout this transformers writes, per
expert or fused), imported with `MTNLG checkpoint import`, their logits taken with `MTNLG
checkpoint logits` (on the CPU: mtnlg runs MoE layers there) and compared with
transformers'; then the import is exported again (`checkpoint export`) and that
directory loaded by transformers and checked the same way."""
import json
import os
import subprocess
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


TOKENS = [3, 141, 59, 265, 158, 97, 93, 238, 262, 64, 33, 83, 279, 50, 288, 41, 97, 169, 199, 275, 105, 82, 97, 294]


def moe_models():
    """(name, class name, config kwargs) of the tiny MoE models: vocabulary 300, hidden 64."""
    common = dict(vocab_size=300, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                  max_position_embeddings=64, rms_norm_eps=1e-5, tie_word_embeddings=False)
    return [
        ("mixtral", "Mixtral", dict(common, intermediate_size=48, num_hidden_layers=2, num_local_experts=8,
                                    num_experts_per_tok=2, sliding_window=None)),
        ("qwen2-moe", "Qwen2Moe", dict(common, intermediate_size=96, moe_intermediate_size=32,
                                       shared_expert_intermediate_size=48, num_hidden_layers=3, num_experts=6,
                                       num_experts_per_tok=2, norm_topk_prob=False, mlp_only_layers=[1])),
        ("qwen3-moe", "Qwen3Moe", dict(common, intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=3,
                                       num_experts=8, num_experts_per_tok=2, norm_topk_prob=True,
                                       mlp_only_layers=[0])),
    ]


def moe_case(mtnlg, out, name, cls, kwargs, bound):
    if not hasattr(transformers, cls + "ForCausalLM"):
        print(f"hf-check: NOT CHECKED: transformers {transformers.__version__} has no {cls}ForCausalLM")
        return 0
    torch.manual_seed(0)
    model = getattr(transformers, cls + "ForCausalLM")(getattr(transformers, cls + "Config")(**kwargs))
    with torch.no_grad():  # every weight random (a router left at zero would tie every expert)
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * 0.1 + (1.0 if p.dim() == 1 else 0.0))
    hf_dir, ckpt, ref = f"{out}/{name}-hf", f"{out}/{name}-ckpt", f"{out}/{name}-ref.safetensors"
    model.save_pretrained(hf_dir)
    tokens = ",".join(map(str, TOKENS))
    for cmd in (["checkpoint", "import", "--input", hf_dir, "--output", ckpt],
                ["checkpoint", "logits", "--input", ckpt, "--device", "cpu", "--output", ref, "--tokens", tokens],
                ["checkpoint", "export", "--input", ckpt, "--output", f"{out}/{name}-back"]):
        r = subprocess.run([mtnlg] + cmd, capture_output=True, text=True)
        if r.returncode != 0:
            print(f"hf-check: {name}: mtnlg {' '.join(cmd[:2])} failed: {(r.stdout + r.stderr).strip()[-400:]}")
            return 1
    print(f"hf-check: {name}: transformers' {cls}ForCausalLM imported by mtnlg")
    rc = main(hf_dir, ref, bound)
    print(f"hf-check: {name}: mtnlg's export of that import")
    return rc | main(f"{out}/{name}-back", ref, bound)


def moe_main(mtnlg, out, bound=1e-3):
    os.makedirs(out, exist_ok=True)
    rc = 0
    for name, cls, kwargs in moe_models():
        rc |= moe_case(mtnlg, out, name, cls, kwargs, bound)
    return rc


if __name__ == "__main__":
    if sys.argv[1] == "--moe":
        sys.exit(moe_main(sys.argv[2], sys.argv[3], float(sys.argv[4]) if len(sys.argv) > 4 else 1e-3))
    sys.exit(main(sys.argv[1], sys.argv[2], float(sys.argv[3]) if len(sys.argv) > 3 else 1e-3))
