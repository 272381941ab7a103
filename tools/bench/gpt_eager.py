#!/usr/bin/env python3
"""The GPT of trainers/llm written in plain PyTorch eager, for `make bench`.

Same architecture (token + position embeddings, pre-LayerNorm blocks with one
fused qkv projection, causal softmax attention, tanh-GELU MLP, final LayerNorm,
head tied to the token embedding), same optimizer (AdamW, decay only on
matrices, global-norm clipping at 1.0), same batch and sequence length. Prints
one JSON line: median step time, tokens/s and peak RSS, and how the run computed
("precision": fp32, tf32 or bf16; "attention": math or sdpa; "compiled").

`--device cuda` (tools/device/check.sh) builds the model on the GPU, in fp32 with
TF32 matrix products off unless `--tf32`, synchronizes the device before and
after each timed step, and adds the GPU's name and peak memory to the line.

Without options this is the plain model (what `make bench` times, on PyTorch
1.13 too). The options write it as a user who tunes PyTorch would, so that a
comparison is against eager at its best rather than at its plainest:

  --bf16         forward and loss under torch.autocast(bfloat16); the weights,
                 gradients and AdamW stay float32, as autocast's users keep them
  --sdpa         attention through F.scaled_dot_product_attention(is_causal=True)
                 (the flash or memory-efficient kernel) instead of the masked softmax
  --fused-adamw  torch.optim.AdamW(fused=True): one kernel for the whole update
  --free-grads   optimizer.zero_grad(set_to_none=True) (PyTorch 2.x's default): the
                 gradients are freed between steps, so forward runs without them
  --tuned        all four
  --compile      model = torch.compile(model); the first step compiles forward and
                 backward, its seconds are reported as "compile_s", and the timed
                 steps start after the warm-up (at least 2 steps)

An option the PyTorch or the device cannot honour is refused: one line on
stderr, exit code 2 (no silent fallback to the plain model).
"""
import argparse
import json
import math
import resource
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, h, heads, ffn, sdpa=False):
        super().__init__()
        self.heads = heads
        self.sdpa = sdpa
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
        if self.sdpa:  # the same scale, 1/sqrt(d), and causal mask in one call (a fused kernel on cuda)
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(d)
            att = torch.softmax(scores.masked_fill(mask, float("-inf")), dim=-1)
            y = torch.matmul(att, v)
        y = y.transpose(1, 2).reshape(b, t, h)
        x = x + self.proj(y)
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, vocab, seq, h, heads, layers, sdpa=False):
        super().__init__()
        self.tok = nn.Embedding(vocab, h)
        self.pos = nn.Embedding(seq, h)
        self.blocks = nn.ModuleList(Block(h, heads, 4 * h, sdpa) for _ in range(layers))
        self.ln_f = nn.LayerNorm(h)
        self.register_buffer("mask", torch.triu(torch.ones(seq, seq, dtype=torch.bool), 1))

    def forward(self, tokens, targets):
        x = self.tok(tokens) + self.pos.weight[: tokens.shape[1]]
        for blk in self.blocks:
            x = blk(x, self.mask)
        logits = F.linear(self.ln_f(x), self.tok.weight)
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1), reduction="sum") / targets.numel()


def refuse(message):
    print(f"gpt_eager.py: {message}", file=sys.stderr)
    sys.exit(2)


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
    p.add_argument("--bf16", action="store_true", help="forward and loss under torch.autocast(bfloat16)")
    p.add_argument("--sdpa", action="store_true", help="attention through F.scaled_dot_product_attention")
    p.add_argument("--fused-adamw", action="store_true", help="torch.optim.AdamW(fused=True)")
    p.add_argument("--free-grads", action="store_true", help="zero_grad(set_to_none=True) between steps")
    p.add_argument("--tuned", action="store_true", help="--bf16 --sdpa --fused-adamw --free-grads")
    p.add_argument("--compile", action="store_true", help="torch.compile(model); first step's time as compile_s")
    a = p.parse_args()
    if a.tuned:
        a.bf16 = a.sdpa = a.fused_adamw = a.free_grads = True
    cuda = a.device != "cpu"
    # Refused before any work, so a caller sees at once which option this PyTorch or device lacks.
    if a.tf32 and not cuda:
        refuse("--tf32 applies to cuda only (the host's fp32 matrix products have no TF32)")
    if a.sdpa and not hasattr(F, "scaled_dot_product_attention"):
        refuse(f"--sdpa needs F.scaled_dot_product_attention (PyTorch 2.0 or later), this is {torch.__version__}")
    if a.compile and not hasattr(torch, "compile"):
        refuse(f"--compile needs torch.compile (PyTorch 2.0 or later), this is {torch.__version__}")
    if a.compile and a.warmup < 2:
        refuse("--compile needs --warmup 2 or more: the first step compiles, the second may still settle")
    if a.bf16 and cuda and not torch.cuda.is_bf16_supported():
        refuse(f"--bf16: {torch.cuda.get_device_name()} has no bfloat16 support")
    if a.threads > 0:
        torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    if cuda:
        device = torch.device(a.device)
        if device.index is None:
            device = torch.device(device.type, 0)
        torch.cuda.set_device(device)
        torch.backends.cuda.matmul.allow_tf32 = a.tf32
        with device:  # parameters are created on the GPU, not copied there
            model = GPT(a.vocab, a.seq, a.hidden, a.heads, a.layers, a.sdpa)
    else:
        device = torch.device("cpu")
        model = GPT(a.vocab, a.seq, a.hidden, a.heads, a.layers, a.sdpa)
    decay = [q for q in model.parameters() if q.dim() >= 2]
    no_decay = [q for q in model.parameters() if q.dim() < 2]
    groups = [{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}]
    if a.fused_adamw:
        try:
            opt = torch.optim.AdamW(groups, lr=1e-3, fused=True)
        except (TypeError, RuntimeError) as e:  # PyTorch 1.13's AdamW has no `fused`; some devices no kernel
            refuse(f"--fused-adamw: this PyTorch ({torch.__version__}) has no fused AdamW for {device.type}"
                   f" ({str(e).splitlines()[0]})")
    else:
        opt = torch.optim.AdamW(groups, lr=1e-3)
    n_params = sum(q.numel() for q in model.parameters())
    if a.compile:
        model = torch.compile(model)
    # Autocast covers forward and loss only, as its documentation prescribes: backward runs in the
    # dtypes forward chose, the optimizer on the float32 parameters.
    autocast = torch.autocast(device_type=device.type, dtype=torch.bfloat16) if a.bf16 else None
    times = []
    compile_s = None
    for step in range(a.warmup + a.steps):
        tokens = torch.randint(0, a.vocab, (a.batch, a.seq))
        targets = torch.randint(0, a.vocab, (a.batch, a.seq))
        if cuda:
            tokens, targets = tokens.to(device), targets.to(device)
            torch.cuda.synchronize()
        start = time.perf_counter()
        if autocast is not None:
            with autocast:
                loss = model(tokens, targets)
        else:
            loss = model(tokens, targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=a.free_grads)
        loss.item()
        if cuda:
            torch.cuda.synchronize()
        if step == 0 and a.compile:
            compile_s = time.perf_counter() - start
        if step >= a.warmup:
            times.append(time.perf_counter() - start)
    step_time = statistics.median(times)
    result = {
        "step_time_s": step_time,
        "tokens_per_s": a.batch * a.seq / step_time,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0,
        "params": n_params,
        "threads": torch.get_num_threads(),
        "precision": "bf16" if a.bf16 else ("tf32" if a.tf32 else "fp32"),
        "attention": "sdpa" if a.sdpa else "math",
        "fused_adamw": a.fused_adamw,
        "free_grads": a.free_grads,
        "compiled": a.compile,
    }
    if a.compile:
        result["compile_s"] = compile_s  # the first step: compiling forward and backward, then running them
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
