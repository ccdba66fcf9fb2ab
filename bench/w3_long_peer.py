#!/usr/bin/env python3
"""The W3 recipe of the PyTorch peer script torch_ref.py with the learning-rate schedule of the
issue's long run: linear warmup, then cosine decay to lr/10 (the schedule `gpt` uses,
optim/schedule.c: lr(t) = peak*(t+1)/warmup during warmup, then
min + (peak-min)*(1+cos(pi*(t-warmup)/(steps-warmup)))/2).

The model, data, batches and optimizer groups are torch_ref.py's own (imported, not
copied); only the schedule and the size of the validation estimate differ.

    python3 bench/w3_long_peer.py --peers PEERS_DIR --steps 2000 --lr 1e-3 \
        --warmup 100 --eval-batches 100 --sample-tokens 300

Prints one JSON line: val_loss (mean over --eval-batches held-out batches), train_loss
(mean of the last 10 steps), median step time, and a greedy sample.
"""
import argparse, json, math, sys, time

ap = argparse.ArgumentParser()
ap.add_argument("--peers", required=True,
                help="the folder holding torch_ref.py (not part of this repository)")
ap.add_argument("--steps", type=int, default=2000)
ap.add_argument("--lr", type=float, default=1e-3)
ap.add_argument("--warmup", type=int, default=100)
ap.add_argument("--eval-batches", type=int, default=100)
ap.add_argument("--threads", type=int, default=2)
ap.add_argument("--seed", type=int, default=0)
ap.add_argument("--sample-tokens", type=int, default=300)
ap.add_argument("--prompt", default="And God said")
args = ap.parse_args()
sys.path.insert(0, args.peers)
import torch  # noqa: E402
import torch_ref as ref  # noqa: E402

torch.set_num_threads(args.threads)
text = ref.load_kjv(None)
data = torch.frombuffer(bytearray(text), dtype=torch.uint8).long()
n_train = int(0.9 * len(data))
train, val = data[:n_train], data[n_train:]
B, T = 16, 128
torch.manual_seed(args.seed)
model = ref.GPT(vocab=256, T=T, n_layer=4, n_head=4, d=256)
decay = [p for p in model.parameters() if p.dim() >= 2]
no_decay = [p for p in model.parameters() if p.dim() < 2]
opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                         {"params": no_decay, "weight_decay": 0.0}], lr=args.lr)
gen = torch.Generator().manual_seed(1234 + args.seed)
peak, low, W, S = args.lr, args.lr / 10, args.warmup, args.steps


def lr_at(t):
    if t < W:
        return peak * (t + 1) / W
    return low + (peak - low) * (1 + math.cos(math.pi * (t - W) / (S - W))) / 2


def batch(src, g):
    ix = torch.randint(len(src) - T - 1, (B,), generator=g)
    return (torch.stack([src[i:i + T] for i in ix]), torch.stack([src[i + 1:i + 1 + T] for i in ix]))


times, losses = [], []
t_start = time.perf_counter()
for s in range(S):
    for g in opt.param_groups:
        g["lr"] = lr_at(s)
    x, y = batch(train, gen)
    t0 = time.perf_counter()
    opt.zero_grad(set_to_none=True)
    loss = model(x, y)
    loss.backward()
    opt.step()
    times.append(time.perf_counter() - t0)
    losses.append(loss.item())
    if (s + 1) % 200 == 0:
        print(f"step {s + 1} loss {losses[-1]:.4f} lr {lr_at(s):.2e}", file=sys.stderr, flush=True)
model.eval()
vgen = torch.Generator().manual_seed(999)
with torch.no_grad():
    vl = [model(*batch(val, vgen)).item() for _ in range(args.eval_batches)]
    # greedy continuation (the peer model's forward takes targets: recompute logits here)
    toks = list(args.prompt.encode())
    for _ in range(args.sample_tokens):
        idx = torch.tensor([toks[-T:]])
        pos = torch.arange(idx.shape[1])
        h = model.wte(idx) + model.wpe(pos)
        for blk in model.h:
            h = blk(h)
        logits = model.lm_head(model.ln_f(h))[0, -1]
        toks.append(int(logits.argmax()))
t = sorted(times[10:])
print(json.dumps({"workload": "w3_long_peer", "steps": S, "lr": peak, "warmup": W,
                  "val_loss": sum(vl) / len(vl), "eval_batches": len(vl),
                  "train_loss": sum(losses[-10:]) / 10, "median_ms": 1e3 * t[len(t) // 2],
                  "wall_s": time.perf_counter() - t_start,
                  "sample": bytes(toks).decode("utf-8", "replace")}))
