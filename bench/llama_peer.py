#!/usr/bin/env python3
"""llama_peer.py - the PyTorch peer of bench/bench_llama.c: the same Llama architecture
(RMSNorm, rotary embeddings in the half-split layout, SwiGLU MLP, grouped-query attention,
no biases, untied head) at nabla's default config (4 layers, 4 heads on 2 key/value heads,
width 256, MLP 704, vocab 256), batch 16 of 128 tokens, AdamW lr 3e-4: the median step time.

A minimal equivalent of transformers' LlamaForCausalLM written in plain PyTorch (F.rms_norm,
F.scaled_dot_product_attention with enable_gqa, torch.optim.AdamW's default foreach path), so
the peer pays no framework overhead of transformers'. Needs PyTorch 2.x (pip install torch).

Usage: llama_peer.py [--steps N] [--warmup N] [--threads N] [--bf16]
Output: a human line, then one JSON line {"median_ms", "tokens_per_s", "loss"}.
"""
import argparse
import json
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

V, C, L, H, HKV, FF, T, B = 256, 256, 4, 4, 2, 704, 128, 16
HD = C // H


def rotate_half(x):
    return torch.cat((-x[..., HD // 2:], x[..., : HD // 2]), dim=-1)


class Layer(nn.Module):
    def __init__(self):
        super().__init__()
        self.q = nn.Linear(C, C, bias=False)
        self.k = nn.Linear(C, HKV * HD, bias=False)
        self.v = nn.Linear(C, HKV * HD, bias=False)
        self.o = nn.Linear(C, C, bias=False)
        self.gate = nn.Linear(C, FF, bias=False)
        self.up = nn.Linear(C, FF, bias=False)
        self.down = nn.Linear(FF, C, bias=False)
        self.n1 = nn.Parameter(torch.ones(C))
        self.n2 = nn.Parameter(torch.ones(C))

    def forward(self, x, cos, sin):
        b, t, _ = x.shape
        h = F.rms_norm(x, (C,), self.n1, 1e-5)
        q = self.q(h).view(b, t, H, HD).transpose(1, 2)
        k = self.k(h).view(b, t, HKV, HD).transpose(1, 2)
        v = self.v(h).view(b, t, HKV, HD).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        x = x + self.o(a.transpose(1, 2).reshape(b, t, C))
        h = F.rms_norm(x, (C,), self.n2, 1e-5)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class Llama(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(V, C)
        self.layers = nn.ModuleList(Layer() for _ in range(L))
        self.norm = nn.Parameter(torch.ones(C))
        self.head = nn.Linear(C, V, bias=False)
        for p in self.parameters():
            if p.dim() == 2:
                nn.init.normal_(p, 0.0, 0.02)
        inv = 1.0 / (10000.0 ** (torch.arange(0, HD, 2).float() / HD))
        ang = torch.arange(T).float()[:, None] * inv[None, :]
        emb = torch.cat((ang, ang), dim=-1)
        self.register_buffer("cos", emb.cos(), persistent=False)
        self.register_buffer("sin", emb.sin(), persistent=False)

    def forward(self, idx):
        x = self.embed(idx)
        for layer in self.layers:
            x = layer(x, self.cos, self.sin)
        return self.head(F.rms_norm(x, (C,), self.norm, 1e-5))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--bf16", action="store_true")
    a = ap.parse_args()
    if a.threads > 0:
        torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    model = Llama()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    times, loss = [], float("nan")
    for s in range(a.warmup + a.steps):
        x = torch.randint(0, V, (B, T))
        y = torch.randint(0, V, (B, T))
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.bf16):
            logits = model(x)
        l = F.cross_entropy(logits.float().view(-1, V), y.view(-1))
        l.backward()
        opt.step()
        loss = l.item()
        t1 = time.perf_counter()
        if s >= a.warmup:
            times.append((t1 - t0) * 1e3)
    med = statistics.median(times)
    print(f"PyTorch {torch.__version__} llama, batch {B} x {T}, {'bf16' if a.bf16 else 'f32'}, "
          f"threads {torch.get_num_threads()}: median step {med:.2f} ms, loss {loss:.4f}")
    print(json.dumps({"median_ms": med, "tokens_per_s": B * T / med * 1e3, "loss": loss}))


if __name__ == "__main__":
    main()
