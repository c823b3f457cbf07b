"""dev/torch_bench.py — the same work in PyTorch on the same GPU, for scripts/gpu_check.sh to print
beside ours: a GPT-2 124M training step (Hugging Face's GPT2LMHeadModel with SDPA attention, bf16
autocast, torch.compile, fused AdamW), a BERT-base sequence-classification fine-tuning step the same
way (BertForSequenceClassification, dropout on, full-length sequences, as `train_bert --bench`), SDPA
forward+backward through the flash and cuDNN backends at our attention benchmark's shape, and a bf16
GEMM at our matmul benchmark's shape. A benchmark, not an oracle: nothing here checks correctness.

    python3 dev/torch_bench.py [--batch B] [--seq T] [--bert-batch B] [--bert-seq T] [--steps N]

Prints one line per figure and, last, one line `TORCH_JSON {...}` with all of them. Exits 3 when
python has no torch or torch sees no CUDA GPU (gpu_check then says PyTorch was not compared).
"""
import argparse
import json
import sys
import time

try:
    import torch
    import torch.nn.functional as F
except ImportError:
    print(f"torch_bench: {sys.executable} has no torch", file=sys.stderr)
    sys.exit(3)


def cuda_time_ms(fn, reps, warmup=3):
    """Median time of fn() in ms over reps calls, timed with CUDA events after warm-up calls."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop))
    times.sort()
    return times[len(times) // 2]


def timed_training(model, weight_decay, lr, inputs, steps):
    """ms per training step of a transformers model on fixed inputs (a dict of its forward's
    arguments, labels included): bf16 autocast, torch.compile, gradient clipping at 1, fused AdamW;
    and the seconds the first step took (compilation) and the peak memory."""
    model = model.cuda()
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay, fused=True)
    compiled = torch.compile(model)

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = compiled(**inputs).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    torch.cuda.reset_peak_memory_stats()
    t0 = time.time()
    step()  # compiles
    torch.cuda.synchronize()
    compile_s = time.time() - t0
    ms = cuda_time_ms(step, steps, warmup=2)
    return ms, compile_s, torch.cuda.max_memory_allocated() / 2**20


def gpt2_step(batch, seq, steps):
    """tokens/s of GPT-2 124M training steps (vocabulary padded to 50304, as ours)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(vocab_size=50304, n_positions=1024, n_embd=768, n_layer=12, n_head=12,
                        attn_implementation="sdpa")
    gen = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randint(0, 50257, (batch, seq), device="cuda", generator=gen)
    ms, compile_s, peak_mib = timed_training(GPT2LMHeadModel(config), 0.1, 3e-4, {"input_ids": x, "labels": x}, steps)
    return {"tokens_per_s": batch * seq / (ms / 1e3), "ms_per_step": ms, "compile_s": compile_s,
            "peak_mib": peak_mib, "batch": batch, "seq": seq}


def bert_step(batch, seq, steps):
    """samples/s of BERT-base sequence-classification fine-tuning steps (2 labels, dropout 0.1, every
    sequence seq tokens long with no padding: what `train_bert --bench --config base` times)."""
    from transformers import BertConfig, BertForSequenceClassification

    config = BertConfig(num_labels=2, attn_implementation="sdpa")  # bert-base: 12 layers, 768, 12 heads
    gen = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randint(1000, config.vocab_size, (batch, seq), device="cuda", generator=gen)
    labels = torch.randint(0, 2, (batch,), device="cuda", generator=gen)
    inputs = {"input_ids": x, "attention_mask": torch.ones_like(x), "labels": labels}
    ms, compile_s, peak_mib = timed_training(BertForSequenceClassification(config), 0.01, 2e-5, inputs, steps)
    return {"samples_per_s": batch / (ms / 1e3), "ms_per_step": ms, "compile_s": compile_s, "peak_mib": peak_mib,
            "batch": batch, "seq": seq}


def sdpa(B=8, T=1024, NH=12, HS=64):
    """TFLOP/s of causal SDPA forward and backward in bf16 per backend, with our benchmark's FLOP
    count: forward 4·B·NH·T²·HS halved by the mask, backward 2.5 times the forward."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    fwd_flops = 4.0 * B * NH * T * T * HS * 0.5
    q, k, v = (torch.randn(B, NH, T, HS, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    dout = torch.randn(B, NH, T, HS, device="cuda", dtype=torch.bfloat16)
    result = {}
    for name, backend in (("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION)):
        try:
            with sdpa_kernel(backend):
                fwd_ms = cuda_time_ms(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True), 20)
                out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
                bwd_ms = cuda_time_ms(lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True), 20)
            result[name] = {"fwd_tflops": fwd_flops / (fwd_ms * 1e-3) / 1e12,
                            "bwd_tflops": 2.5 * fwd_flops / (bwd_ms * 1e-3) / 1e12}
        except RuntimeError as e:  # a backend this GPU or build lacks
            result[name] = {"error": str(e).splitlines()[0][:200]}
    return result


def gemm(N=8192, C=768, OC=3072):
    """TFLOP/s of out (N,OC) = inp (N,C) · Wᵀ in bf16 (GPT-2's MLP up-projection at B·T = 8192)."""
    inp = torch.randn(N, C, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(OC, C, device="cuda", dtype=torch.bfloat16)
    ms = cuda_time_ms(lambda: F.linear(inp, w), 50)
    return {"tflops": 2.0 * N * C * OC / (ms * 1e-3) / 1e12, "shape": [N, C, OC]}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--bert-batch", type=int, default=32)
    ap.add_argument("--bert-seq", type=int, default=256)
    ap.add_argument("--steps", type=int, default=10)
    args = ap.parse_args()
    for name in ("batch", "seq", "bert_batch", "bert_seq", "steps"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be at least 1")
    if not torch.cuda.is_available():
        print("torch_bench: torch sees no CUDA GPU", file=sys.stderr)
        return 3
    out = {"torch": torch.__version__, "device": torch.cuda.get_device_name(0)}
    out["gemm_bf16"] = gemm()
    print(f"torch bf16 GEMM {out['gemm_bf16']['shape']}: {out['gemm_bf16']['tflops']:.1f} TFLOP/s", flush=True)
    out["sdpa_bf16_causal"] = sdpa()
    for name, r in out["sdpa_bf16_causal"].items():
        print(f"torch SDPA {name}: {r}", flush=True)
    runs = (("gpt2_124m_step", "GPT-2 124M step", lambda: gpt2_step(args.batch, args.seq, args.steps)),
            ("bert_base_classify_step", "BERT-base classification step",
             lambda: bert_step(args.bert_batch, args.bert_seq, args.steps)))
    for key, name, run in runs:
        try:
            out[key] = run()
        except Exception as e:  # transformers missing or too old, out of memory: the other figures still stand
            out[key] = {"error": f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:200]}"}
        print(f"torch {name}: {out[key]}", flush=True)
        torch.cuda.empty_cache()
    print("TORCH_JSON " + json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
