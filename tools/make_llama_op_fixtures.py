#!/usr/bin/env python3
"""make_llama_op_fixtures.py - writes tests/fixtures/llama/ops.safetensors, the PyTorch
references of the Llama family's ops that the "lm_ops" suite (tests/test_lm_ops.c) compares
nabla's with: RMSNorm, rotary position embeddings, SiLU, the SwiGLU product and grouped-query
causal attention, forward and backward, in f32 and bf16.

Each op is computed the way Hugging Face's transformers computes it in its Llama model
(modeling_llama.py: LlamaRMSNorm, LlamaRotaryEmbedding + apply_rotary_pos_emb, the MLP's
act_fn(gate) * up, and attention with fewer key/value heads, which it repeats with repeat_kv),
written out here in plain PyTorch so that only torch is needed; tools/make_llama_fixture.py
checks the whole model against transformers itself.

Run with a PyTorch 2.x interpreter (CI does not: the file is committed):

    python3 tools/make_llama_op_fixtures.py

Entries (f32 unless the name ends in _bf16; gradients for the output gradient "...g"):
  rms.x (3, 5, 24), rms.w (24), rms.g, rms.y, rms.dx, rms.dw           eps 1e-6
  rms.x_bf16, rms.w_bf16, rms.y_bf16 (HF: computed in f32, cast back to bf16)
  rope.x (2, 7, 3, 8) laid out (B, T, H, D), rope.g, rope.y, rope.dx    base 500, offset 5
  rope.x_bf16, rope.y_bf16 (HF: cos and sin cast to bf16, products in bf16)
  glu.a (4, 33), glu.b, glu.g, silu.y, glu.y, glu.da, glu.db
  glu.a_bf16, glu.b_bf16, glu.y_bf16
  gqa.q (2, 4, 9, 8), gqa.k (2, 2, 9, 8), gqa.v, gqa.g, gqa.o, gqa.dq, gqa.dk, gqa.dv
  gqa.q_bf16, gqa.k_bf16, gqa.v_bf16, gqa.o_bf16 (f32 math, as nabla's bf16 attention)
"""
import os

import torch
import torch.nn.functional as F
from safetensors.torch import save_file

OUT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests",
                                    "fixtures", "llama", "ops.safetensors"))
torch.manual_seed(33)
out = {}


def rms_norm(x, w, eps):
    """LlamaRMSNorm.forward"""
    dt = x.dtype
    h = x.to(torch.float32)
    var = h.pow(2).mean(-1, keepdim=True)
    h = h * torch.rsqrt(var + eps)
    return w * h.to(dt)


def rope_cos_sin(dim, base, positions, dtype):
    """LlamaRotaryEmbedding (default rope type): cos, sin of shape (T, dim)"""
    inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).to(dtype=torch.float)
                               / dim))
    freqs = (inv_freq[None, :, None].float() @ positions[None, None, :].float()).transpose(1, 2)
    emb = torch.cat((freqs, freqs), dim=-1)[0]
    return emb.cos().to(dtype), emb.sin().to(dtype)


def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def rope(x_bthd, base, offset):
    """apply_rotary_pos_emb on (B, H, T, D), given and returned as (B, T, H, D)"""
    x = x_bthd.transpose(1, 2)
    T, D = x.shape[2], x.shape[3]
    cos, sin = rope_cos_sin(D, base, torch.arange(offset, offset + T), x.dtype)
    y = x * cos[None, None] + rotate_half(x) * sin[None, None]
    return y.transpose(1, 2)


def gqa_attention(q, k, v):
    """causal attention with k, v repeated per group (repeat_kv), in q's dtype"""
    rep = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(rep, dim=1)
    v = v.repeat_interleave(rep, dim=1)
    T = q.shape[2]
    att = (q @ k.transpose(-2, -1)) / (q.shape[-1] ** 0.5)
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    att = att.masked_fill(~mask, float("-inf")).softmax(-1)
    return att @ v


def leaf(t):
    return t.clone().requires_grad_(True)


# ---- RMSNorm
x = torch.randn(3, 5, 24) * 2 + 0.5
w = torch.rand(24) + 0.5
g = torch.randn(3, 5, 24)
xl, wl = leaf(x), leaf(w)
y = rms_norm(xl, wl, 1e-6)
y.backward(g)
out.update({"rms.x": x, "rms.w": w, "rms.g": g, "rms.y": y.detach(), "rms.dx": xl.grad,
            "rms.dw": wl.grad})
xb, wb = x.bfloat16(), w.bfloat16()
out.update({"rms.x_bf16": xb, "rms.w_bf16": wb, "rms.y_bf16": rms_norm(xb, wb, 1e-6)})

# ---- rotary
x = torch.randn(2, 7, 3, 8)
g = torch.randn(2, 7, 3, 8)
xl = leaf(x)
y = rope(xl, 500.0, 5)
y.backward(g)
out.update({"rope.x": x, "rope.g": g, "rope.y": y.detach(), "rope.dx": xl.grad})
out.update({"rope.x_bf16": x.bfloat16(), "rope.y_bf16": rope(x.bfloat16(), 500.0, 5)})

# ---- SiLU and SwiGLU
a = torch.randn(4, 33) * 3
b = torch.randn(4, 33)
g = torch.randn(4, 33)
al, bl = leaf(a), leaf(b)
y = F.silu(al) * bl
y.backward(g)
out.update({"glu.a": a, "glu.b": b, "glu.g": g, "silu.y": F.silu(a), "glu.y": y.detach(),
            "glu.da": al.grad, "glu.db": bl.grad})
out.update({"glu.a_bf16": a.bfloat16(), "glu.b_bf16": b.bfloat16(),
            "glu.y_bf16": F.silu(a.bfloat16()) * b.bfloat16()})

# ---- grouped-query attention
q = torch.randn(2, 4, 9, 8)
k = torch.randn(2, 2, 9, 8)
v = torch.randn(2, 2, 9, 8)
g = torch.randn(2, 4, 9, 8)
ql, kl, vl = leaf(q), leaf(k), leaf(v)
o = gqa_attention(ql, kl, vl)
o.backward(g)
out.update({"gqa.q": q, "gqa.k": k, "gqa.v": v, "gqa.g": g, "gqa.o": o.detach(),
            "gqa.dq": ql.grad, "gqa.dk": kl.grad, "gqa.dv": vl.grad})
qb, kb, vb = q.bfloat16(), k.bfloat16(), v.bfloat16()
out.update({"gqa.q_bf16": qb, "gqa.k_bf16": kb, "gqa.v_bf16": vb,
            "gqa.o_bf16": gqa_attention(qb.float(), kb.float(), vb.float()).bfloat16()})

os.makedirs(os.path.dirname(OUT), exist_ok=True)
save_file({n: t.contiguous() for n, t in out.items()}, OUT,
          metadata={"made_by": "tools/make_llama_op_fixtures.py", "torch": torch.__version__})
print("wrote", OUT, os.path.getsize(OUT), "bytes,", len(out), "tensors")
