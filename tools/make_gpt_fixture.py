#!/usr/bin/python3
"""make_gpt_fixture.py - writes the fixtures of the "gpt" test suite: tiny nanoGPT models
built in PyTorch, their weights under nanoGPT's parameter names, and the logits (and, for
the first, the loss and every parameter's gradient) they give on a fixed input. The test
(tests/test_gpt.c) loads the weights into the library's GPT (nabla/gpt.h) with
nb_module_load - so the names must match nanoGPT's exactly - and compares.

Run from anywhere with Debian's interpreter (torch 1.13, numpy; no other package needed:
the safetensors files are written by hand, the format is an 8-byte little-endian header
length, a JSON header, then the raw little-endian data):

    /usr/bin/python3 tools/make_gpt_fixture.py

It writes into tests/fixtures/gpt/:

  tiny.safetensors       n_layer 2, n_head 2, n_embd 16, block 16, vocab 64, biases, exact
                         GELU: the state dict (nanoGPT's names; the tied lm_head.weight is
                         the same tensor as transformer.wte.weight and is left out)
  tiny_io.safetensors    idx (2, 16) i64, targets (2, 16) i64, logits (2, 16, 64) f32,
                         loss () f64 (mean cross entropy), grad.<parameter name> f32
  nobias.safetensors     n_layer 1, n_head 4, n_embd 16, block 8, vocab 64, bias=False,
                         tanh GELU
  nobias_io.safetensors  idx (1, 8), logits (1, 8, 64)

The weights are random (seeded), not nanoGPT's N(0, 0.02) init, and scaled so that
attention is far from uniform and every part of the model matters for the logits. The
reference numbers are computed in float64 from the float32 weights. The architecture below
is nanoGPT's model.py (Karpathy), written out with an explicit causal softmax attention
because torch 1.13 has no scaled_dot_product_attention; dropout is 0.
"""
import json
import math
import os
import struct

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

OUT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests",
                                    "fixtures", "gpt"))


class LayerNorm(nn.Module):
    """LayerNorm with an optional bias (nanoGPT's; PyTorch's has no bias=False)."""

    def __init__(self, ndim, bias):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(ndim))
        self.bias = nn.Parameter(torch.zeros(ndim)) if bias else None

    def forward(self, x):
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, 1e-5)


class CausalSelfAttention(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c_attn = nn.Linear(c["n_embd"], 3 * c["n_embd"], bias=c["bias"])
        self.c_proj = nn.Linear(c["n_embd"], c["n_embd"], bias=c["bias"])
        self.n_head, self.n_embd = c["n_head"], c["n_embd"]

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, T, hs)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        mask = torch.tril(torch.ones(T, T, dtype=torch.bool)).view(1, 1, T, T)
        att = F.softmax(att.masked_fill(~mask, float("-inf")), dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        return self.c_proj(y)


class MLP(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c_fc = nn.Linear(c["n_embd"], 4 * c["n_embd"], bias=c["bias"])
        self.gelu = nn.GELU(approximate="tanh" if c["gelu_tanh"] else "none")
        self.c_proj = nn.Linear(4 * c["n_embd"], c["n_embd"], bias=c["bias"])

    def forward(self, x):
        return self.c_proj(self.gelu(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.ln_1 = LayerNorm(c["n_embd"], c["bias"])
        self.attn = CausalSelfAttention(c)
        self.ln_2 = LayerNorm(c["n_embd"], c["bias"])
        self.mlp = MLP(c)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(c["vocab_size"], c["n_embd"]),
            wpe=nn.Embedding(c["block_size"], c["n_embd"]),
            h=nn.ModuleList([Block(c) for _ in range(c["n_layer"])]),
            ln_f=LayerNorm(c["n_embd"], c["bias"]),
        ))
        self.lm_head = nn.Linear(c["n_embd"], c["vocab_size"], bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # weight tying, as nanoGPT

    def forward(self, idx, targets=None):
        B, T = idx.size()
        pos = torch.arange(0, T, dtype=torch.long)
        x = self.transformer.wte(idx) + self.transformer.wpe(pos)
        for block in self.transformer.h:
            x = block(x)
        logits = self.lm_head(self.transformer.ln_f(x))
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
        return logits, loss


def randomize(model, gen):
    """Random float32 weights: norms near 1, biases small, matrices large enough that the
    softmax attention is far from uniform."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            r = torch.randn(p.shape, generator=gen, dtype=torch.float64)
            if name.endswith("ln_1.weight") or name.endswith("ln_2.weight") or name.endswith("ln_f.weight"):
                v = 1.0 + 0.2 * r
            elif name.endswith(".bias"):
                v = 0.1 * r
            elif "wte" in name or "wpe" in name:
                v = 0.5 * r
            else:
                v = r / math.sqrt(p.shape[1])  # unit-variance outputs
            p.copy_(v.float())


DTYPES = {np.dtype("float32"): "F32", np.dtype("float64"): "F64", np.dtype("int64"): "I64"}


def save_safetensors(path, tensors, metadata=None):
    """tensors: dict name -> numpy array (little-endian), written in the given order."""
    header, blobs, off = {}, [], 0
    if metadata:
        header["__metadata__"] = metadata
    for name, a in tensors.items():
        a = np.ascontiguousarray(a)
        b = a.astype(a.dtype.newbyteorder("<")).tobytes()
        header[name] = {"dtype": DTYPES[a.dtype], "shape": list(a.shape),
                        "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def make(name, c, B, seed, with_grads):
    gen = torch.Generator().manual_seed(seed)
    model = GPT(c)
    randomize(model, gen)
    weights = {n: p.detach().numpy().copy() for n, p in model.named_parameters()}
    assert "lm_head.weight" not in weights  # tied: listed once, as transformer.wte.weight
    idx = torch.randint(c["vocab_size"], (B, c["block_size"]), generator=gen)
    targets = torch.randint(c["vocab_size"], (B, c["block_size"]), generator=gen)
    model = model.double()
    logits, loss = model(idx, targets)
    loss.backward()
    io = {"idx": idx.numpy(), "logits": logits.detach().float().numpy()}
    if with_grads:
        io["targets"] = targets.numpy()
        io["loss"] = np.array(loss.item(), dtype=np.float64)
        for n, p in model.named_parameters():
            io["grad." + n] = p.grad.float().numpy()
    save_safetensors(os.path.join(OUT, name + ".safetensors"), weights, {"format": "pt"})
    save_safetensors(os.path.join(OUT, name + "_io.safetensors"), io)
    print(f"{name}: {sum(w.size for w in weights.values())} parameters, loss {loss.item():.6f}, "
          f"logits std {logits.std().item():.3f}")


def main():
    os.makedirs(OUT, exist_ok=True)
    make("tiny", dict(vocab_size=64, block_size=16, n_layer=2, n_head=2, n_embd=16, bias=True,
                      gelu_tanh=False), B=2, seed=1234, with_grads=True)
    make("nobias", dict(vocab_size=64, block_size=8, n_layer=1, n_head=4, n_embd=16, bias=False,
                        gelu_tanh=True), B=1, seed=4321, with_grads=False)


if __name__ == "__main__":
    main()
