#!/usr/bin/env python3
"""The GPT of trainers/llm written in plain PyTorch eager, for `make bench`.

Same architecture (token + position embeddings, pre-LayerNorm blocks with one
fused qkv projection, causal softmax attention, tanh-GELU MLP, final LayerNorm,
head tied to the token embedding), same optimizer (AdamW, decay only on
matrices, global-norm clipping at 1.0), same batch and sequence length. Prints
one JSON line: median step time, tokens/s and peak RSS.

`--device cuda` (tools/device/check.sh) builds the model on the GPU, in fp32 with
TF32 matrix products off unless `--tf32`, synchronizes the device before and
after each timed step, and adds the GPU's name and peak memory to the line.
"""
import argparse
import json
import math
import resource
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, h, heads, ffn):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(h)
        self.qkv = nn.Linear(h, 3 * h)
        self.proj = nn.Linear(h, h)
        self.ln2 = nn.LayerNorm(h)
        self.fc1 = nn.Linear(h, ffn)
        self.fc2 = nn.Linear(ffn, h)

    def forward(self, x, mask):
        b, t, h = x.shape
        d = h // self.heads
        q, k, v = self.qkv(self.ln1(x)).view(b, t, self.heads, 3, d).permute(3, 0, 2, 1, 4)
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(d)
        att = torch.softmax(scores.masked_fill(mask, float("-inf")), dim=-1)
        y = torch.matmul(att, v).transpose(1, 2).reshape(b, t, h)
        x = x + self.proj(y)
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, vocab, seq, h, heads, layers):
        super().__init__()
        self.tok = nn.Embedding(vocab, h)
        self.pos = nn.Embedding(seq, h)
        self.blocks = nn.ModuleList(Block(h, heads, 4 * h) for _ in range(layers))
        self.ln_f = nn.LayerNorm(h)
        self.register_buffer("mask", torch.triu(torch.ones(seq, seq, dtype=torch.bool), 1))

    def forward(self, tokens, targets):
        x = self.tok(tokens) + self.pos.weight[: tokens.shape[1]]
        for blk in self.blocks:
            x = blk(x, self.mask)
        logits = F.linear(self.ln_f(x), self.tok.weight)
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1), reduction="sum") / targets.numel()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--layers", type=int, required=True)
    p.add_argument("--hidden", type=int, required=True)
    p.add_argument("--heads", type=int, required=True)
    p.add_argument("--seq", type=int, required=True)
    p.add_argument("--batch", type=int, required=True)
    p.add_argument("--vocab", type=int, default=16)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    p.add_argument("--tf32", action="store_true", help="cuda: TF32 tensor cores for fp32 matrix products")
    a = p.parse_args()
    if a.threads > 0:
        torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    cuda = a.device != "cpu"
    if cuda:
        device = torch.device(a.device)
        if device.index is None:
            device = torch.device(device.type, 0)
        torch.cuda.set_device(device)
        torch.backends.cuda.matmul.allow_tf32 = a.tf32
        with device:  # parameters are created on the GPU, not copied there
            model = GPT(a.vocab, a.seq, a.hidden, a.heads, a.layers)
    else:
        model = GPT(a.vocab, a.seq, a.hidden, a.heads, a.layers)
    decay = [q for q in model.parameters() if q.dim() >= 2]
    no_decay = [q for q in model.parameters() if q.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=1e-3)
    times = []
    for step in range(a.warmup + a.steps):
        tokens = torch.randint(0, a.vocab, (a.batch, a.seq))
        targets = torch.randint(0, a.vocab, (a.batch, a.seq))
        if cuda:
            tokens, targets = tokens.to(device), targets.to(device)
            torch.cuda.synchronize()
        start = time.perf_counter()
        loss = model(tokens, targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=False)
        loss.item()
        if cuda:
            torch.cuda.synchronize()
        if step >= a.warmup:
            times.append(time.perf_counter() - start)
    step_time = statistics.median(times)
    result = {
        "step_time_s": step_time,
        "tokens_per_s": a.batch * a.seq / step_time,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0,
        "params": sum(q.numel() for q in model.parameters()),
        "threads": torch.get_num_threads(),
    }
    if cuda:
        result.update({
            "device": torch.cuda.get_device_name(device),
            "matmul": "tf32" if a.tf32 else "fp32",
            "peak_gpu_mem_gb": torch.cuda.max_memory_allocated(device) / 1e9,
            "torch": torch.__version__,
        })
    print(json.dumps(result))


if __name__ == "__main__":
    main()
