"""A stand-in for transformers, which the CI machine does not have: just enough of its API
for scripts/gpu/hf-check.py --moe (config classes, the three MoE ForCausalLM classes with
save_pretrained, AutoModelForCausalLM.from_pretrained, a forward) so that test_hf_moe.cpp
runs that script's MoE case end to end: its mtnlg command lines, an import of a
directory written in Python, the comparison. config.json gets the fields save_pretrained
would write that hf-check.py leaves to the classes' defaults and mtnlg requires
(rope_theta: Mixtral's 1e6, Qwen's 10000).
Tensor names and shapes are transformers 4's per-expert layout (torch_hf_moe.py describes
it); the forward is torch_hf_moe.py's. On the GPU machine the real transformers runs."""
import json, os, struct, sys
from types import SimpleNamespace
import numpy as np
import torch
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
import torch_hf_llama, torch_hf_moe

__version__ = "stand-in"


def _cfg(mt, arch, rope_theta):
    return lambda **kw: dict(dict(rope_theta=rope_theta), **kw, model_type=mt, architectures=[arch])


MixtralConfig = _cfg("mixtral", "MixtralForCausalLM", 1e6)
Qwen2MoeConfig = _cfg("qwen2_moe", "Qwen2MoeForCausalLM", 10000.0)
Qwen3MoeConfig = _cfg("qwen3_moe", "Qwen3MoeForCausalLM", 10000.0)


def _shapes(c):
    mt, C, H, L, V = c["model_type"], c["hidden_size"], c["num_attention_heads"], c["num_hidden_layers"], c["vocab_size"]
    G, D = c.get("num_key_value_heads") or H, c.get("head_dim") or C // H
    s = {"model.embed_tokens.weight": [V, C], "model.norm.weight": [C], "lm_head.weight": [V, C]}
    for l in range(L):
        p = f"model.layers.{l}."
        s.update({p + "input_layernorm.weight": [C], p + "post_attention_layernorm.weight": [C],
                  p + "self_attn.q_proj.weight": [H * D, C], p + "self_attn.k_proj.weight": [G * D, C],
                  p + "self_attn.v_proj.weight": [G * D, C], p + "self_attn.o_proj.weight": [C, H * D]})
        if mt == "qwen2_moe":
            s.update({p + "self_attn.q_proj.bias": [H * D], p + "self_attn.k_proj.bias": [G * D], p + "self_attn.v_proj.bias": [G * D]})
        if mt == "qwen3_moe":
            s.update({p + "self_attn.q_norm.weight": [D], p + "self_attn.k_norm.weight": [D]})
        if torch_hf_moe.sparse_layer(c, l):
            mix = mt == "mixtral"
            pre = p + ("block_sparse_moe." if mix else "mlp.")
            E, F = (c["num_local_experts"], c["intermediate_size"]) if mix else (c["num_experts"], c["moe_intermediate_size"])
            s[pre + "gate.weight"] = [E, C]
            for e in range(E):
                g, u, d = ("w1", "w3", "w2") if mix else ("gate_proj", "up_proj", "down_proj")
                s.update({f"{pre}experts.{e}.{g}.weight": [F, C], f"{pre}experts.{e}.{u}.weight": [F, C],
                          f"{pre}experts.{e}.{d}.weight": [C, F]})
            if mt == "qwen2_moe":
                S = c["shared_expert_intermediate_size"]
                s.update({pre + "shared_expert.gate_proj.weight": [S, C], pre + "shared_expert.up_proj.weight": [S, C],
                          pre + "shared_expert.down_proj.weight": [C, S], pre + "shared_expert_gate.weight": [1, C]})
        else:
            I = c["intermediate_size"]
            s.update({p + "mlp.gate_proj.weight": [I, C], p + "mlp.up_proj.weight": [I, C], p + "mlp.down_proj.weight": [C, I]})
    return s


class _Model:
    def __init__(self, cfg, w=None):
        self.cfg = cfg
        self.w = w if w is not None else {n: torch.zeros(s) for n, s in _shapes(cfg).items()}

    def parameters(self):
        return list(self.w.values())

    def save_pretrained(self, d):
        os.makedirs(d, exist_ok=True)
        json.dump(self.cfg, open(f"{d}/config.json", "w"))
        hdr, blobs, off = {}, [], 0
        for n, t in self.w.items():
            b = t.numpy().astype(np.float32).tobytes()
            hdr[n] = {"dtype": "F32", "shape": list(t.shape), "data_offsets": [off, off + len(b)]}
            off += len(b)
            blobs.append(b)
        h = json.dumps(hdr).encode()
        h += b" " * ((8 - len(h) % 8) % 8)
        open(f"{d}/model.safetensors", "wb").write(struct.pack("<Q", len(h)) + h + b"".join(blobs))

    def to(self, dev):
        return self

    def eval(self):
        return self

    def __call__(self, tokens):
        w = {k: v.double() for k, v in self.w.items()}
        return SimpleNamespace(logits=torch_hf_moe.logits_of(self.cfg, w, tokens).float())


class MixtralForCausalLM(_Model): pass
class Qwen2MoeForCausalLM(_Model): pass
class Qwen3MoeForCausalLM(_Model): pass


class AutoModelForCausalLM:
    @staticmethod
    def from_pretrained(d, **kw):
        cfg = json.load(open(f"{d}/config.json"))
        return globals()[cfg["architectures"][0]](cfg, torch_hf_llama.read_weights(d))
