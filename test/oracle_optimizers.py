"""test/oracle_optimizers.py — writes the reference results test/test_optimizers.cu compares against,
computed by torch.optim.SGD (single-tensor path) and transformers.optimization.Adafactor (PyTorch, CPU).

Every run starts from the same parameters, a table of tensors of different shapes (a 256x257 matrix of
65792 elements, a 1-row and a 1-column matrix, a matrix of tiny weights (RMS < Adafactor's eps2), a
32x64 matrix, 1-D tensors including an all-zero bias and a single element), and applies STEPS steps
with a fixed gradient sequence, each gradient first multiplied by that step's fp32 gradient scale as
torch.nn.utils.clip_grad_norm_ does. Weight decay goes to the matrices only, through param groups.
Runs: SGD with momentum 0.9, with Nesterov, without momentum, and with dampening 0.25; Adafactor with
transformers' defaults (relative step, parameter scale), with an explicit lr + beta1 + weight decay,
and with warmup_init. The main runs are done twice: with the fp32 gradients (for fp32 parameters) and
with the gradients rounded to bf16 (what the kernels see with bf16 parameters and fp32 master weights).

Parameters and gradients come from a counter-based generator (splitmix64) that test/test_optimizers.cu
reproduces bit for bit, so the fixtures hold only results:
  test/fixtures/optim_sgd.bin        per run: final weights and momentum buffers (every element of the
                                     tensors up to 4096 elements, every 61st and the last of larger
                                     ones) and an FNV-1a 64 hash of all final weights / buffers
  test/fixtures/optim_adafactor.bin  per run: final weights and first moments (same sampling), and the
                                     complete second-moment state (row and column statistics of the
                                     matrices, the full second moment of the 1-D tensors)
File format: "OPTF", then records until the end: u32 name length, name, u32 kind (0 = float32,
1 = uint64), u64 count, count little-endian values.

Regenerate (needs torch and transformers; Debian's python3-torch + pip's transformers work):
  /usr/bin/python3 test/oracle_optimizers.py
torch's fp32 `add(other, alpha=a)` is one fused multiply-add on CPUs with AVX2 (the capability torch
reports in torch.__config__.show()); the fixtures were written on such a CPU.
"""
import os
import struct

import numpy as np
import torch
from transformers.optimization import Adafactor

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "fixtures")

# (shape, weight decay, parameter scale): the table test/test_optimizers.cu uses (same order).
# Parameter scale 0 = all zeros (a fresh bias); "ln" = 1 + values/8, like a layernorm gain.
TABLE = [
    ((256, 257), 1, 2.0**-3),
    ((1, 100), 1, 2.0**-2),
    ((77, 1), 1, 2.0**-2),
    ((33, 45), 1, 2.0**-12),
    ((45,), 0, 0.0),
    ((300,), 0, "ln"),
    ((3,), 0, 1.0),
    ((32, 64), 1, 2.0**-4),
    ((1,), 0, 0.5),
]
GRAD_SCALES = [2.0**-1, 2.0**-4, 2.0**-6, 2.0**-3, 2.0**-5, 2.0**-2, 2.0**-7, 2.0**-8, 1.0]  # per tensor
# Exactly zero gradients, as the embedding rows of tokens absent from a batch get: every 17th row of
# the large matrix (from row 1) and every 7th element of the 300-vector (from element 1). Adafactor's
# statistics of those are eps1 alone, whose rsqrt is huge (and infinite without eps1).
ZERO_ROWS = {0: 17, 5: 7}
STEPS = 6
HOST_SCALES = [1.0, 0.37, 1.0, 0.5, 1.0, 0.9]  # grad_scale per step (fp32)
DEVICE_SCALE, DEVICE_SCALE_FROM = 0.8, 4         # grad_scale_device from this step index on
SAMPLE_FULL, SAMPLE_STRIDE = 4096, 61

M64 = (1 << 64) - 1


def uniform(seed, n):
    """n values in [-1, 1) on a 2^-23 grid: splitmix64 of (seed << 32) + i, top 24 bits."""
    with np.errstate(over="ignore"):
        z = (np.uint64(seed) << np.uint64(32)) + np.arange(n, dtype=np.uint64) + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    u = (z >> np.uint64(40)).astype(np.int64) - (1 << 23)
    return (u.astype(np.float32) * np.float32(2.0**-23)).astype(np.float32)


def sizes():
    return [int(np.prod(shape)) for shape, _, _ in TABLE]


def initial_params():
    """All tensors' initial values as one flat float32 array (table order)."""
    v = uniform(1, sum(sizes()))
    out, off = [], 0
    for (shape, _, scale), n in zip(TABLE, sizes()):
        x = v[off:off + n]
        if scale == "ln":
            x = np.float32(1.0) + x * np.float32(0.125)
        else:
            x = x * np.float32(scale)
        out.append(x.astype(np.float32))
        off += n
    return np.concatenate(out)


def gradient(step):
    """The gradient of step `step` (0-based) as one flat float32 array."""
    v = uniform(100 + step, sum(sizes()))
    out, off = [], 0
    for k, ((shape, _, _), n, scale) in enumerate(zip(TABLE, sizes(), GRAD_SCALES)):
        g = (v[off:off + n] * np.float32(scale)).reshape(shape[0], -1)
        if k in ZERO_ROWS:
            g[1::ZERO_ROWS[k]] = 0.0
        out.append(g.reshape(-1))
        off += n
    return np.concatenate(out).astype(np.float32)


def round_bf16(x):
    """float32 -> bf16 (round to nearest even) -> float32, for finite values."""
    b = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    b = (b + np.uint64(0x7FFF) + ((b >> np.uint64(16)) & np.uint64(1))) >> np.uint64(16)
    return (b << np.uint64(16)).astype(np.uint32).view(np.float32)


def step_scale(s):
    """The fp32 gradient multiplier of step s: host scale times device scale, rounded to fp32."""
    scale = np.float32(HOST_SCALES[s])
    if s >= DEVICE_SCALE_FROM:
        scale = np.float32(scale * np.float32(DEVICE_SCALE))
    return scale


def sample_indices():
    """Flat indices of the sampled elements: all of small tensors, every 61st and the last of large."""
    idx, off = [], 0
    for n in sizes():
        if n <= SAMPLE_FULL:
            idx.extend(range(off, off + n))
        else:
            k = list(range(0, n, SAMPLE_STRIDE))
            if k[-1] != n - 1:
                k.append(n - 1)
            idx.extend(off + i for i in k)
        off += n
    return np.array(idx, dtype=np.int64)


def fnv1a64(arr):
    h = 0xCBF29CE484222325
    for byte in arr.astype(np.float32).tobytes():
        h = ((h ^ byte) * 0x100000001B3) & M64
    return h


def make_params():
    p0 = initial_params()
    params, off = [], 0
    for (shape, _, _), n in zip(TABLE, sizes()):
        params.append(torch.nn.Parameter(torch.from_numpy(p0[off:off + n].copy()).reshape(shape)))
        off += n
    return params


def groups(params, weight_decay):
    decay = [p for p, (_, wd, _) in zip(params, TABLE) if wd]
    no_decay = [p for p, (_, wd, _) in zip(params, TABLE) if not wd]
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def run(opt_factory, bf16_grads):
    """Runs STEPS steps; returns the parameters and the optimizer."""
    params = make_params()
    opt = opt_factory(params)
    for s in range(STEPS):
        g = gradient(s)
        if bf16_grads:
            g = round_bf16(g)
        off = 0
        for p, n in zip(params, sizes()):
            p.grad = torch.from_numpy(g[off:off + n].copy()).reshape(p.shape)
            p.grad.mul_(torch.tensor(step_scale(s)))  # as clip_grad_norm_ scales the gradients
            off += n
        opt.step()
    return params, opt


def flat(tensors):
    return np.concatenate([t.detach().reshape(-1).numpy().astype(np.float32) for t in tensors])


class Writer:
    def __init__(self, path):
        self.f = open(path, "wb")
        self.f.write(b"OPTF")

    def floats(self, name, x):
        x = np.ascontiguousarray(x, dtype=np.float32)
        self._head(name, 0, x.size)
        self.f.write(x.astype("<f4").tobytes())

    def u64(self, name, values):
        self._head(name, 1, len(values))
        self.f.write(struct.pack(f"<{len(values)}Q", *values))

    def _head(self, name, kind, count):
        b = name.encode()
        self.f.write(struct.pack("<I", len(b)) + b + struct.pack("<IQ", kind, count))

    def close(self):
        self.f.close()


BOTH, FP32 = ("fp32", "bf16"), ("fp32",)
# SGD runs: (name, lr, momentum, dampening, nesterov, weight decay, gradient types).
SGD_RUNS = [
    ("momentum", 0.05, 0.9, 0.0, False, 0.01, BOTH),
    ("nesterov", 0.05, 0.9, 0.0, True, 0.01, BOTH),
    ("plain", 0.1, 0.0, 0.0, False, 0.1, BOTH),
    ("dampening", 0.05, 0.9, 0.25, False, 0.01, FP32),
]
# Adafactor runs: (name, keyword arguments besides the defaults, weight decay of the matrices, gradient types).
ADAFACTOR_RUNS = [
    ("default", {}, 0.0, BOTH),
    ("lr-beta1-wd", {"lr": 1e-2, "relative_step": False, "scale_parameter": False, "beta1": 0.9}, 0.1, BOTH),
    ("warmup", {"warmup_init": True}, 0.0, FP32),
]


def write_sgd(path):
    idx = sample_indices()
    w = Writer(path)
    for name, lr, momentum, dampening, nesterov, wd, dtypes in SGD_RUNS:
        for dtype in dtypes:
            factory = lambda ps: torch.optim.SGD(groups(ps, wd), lr=lr, momentum=momentum, dampening=dampening,
                                                 nesterov=nesterov, foreach=False)
            params, opt = run(factory, dtype == "bf16")
            weights = flat(params)
            w.floats(f"sgd/{name}/{dtype}/weights", weights[idx])
            hashes = [fnv1a64(weights)]
            if momentum != 0:
                buf = flat([opt.state[p]["momentum_buffer"] for p in params])
                w.floats(f"sgd/{name}/{dtype}/buf", buf[idx])
                hashes.append(fnv1a64(buf))
            w.u64(f"sgd/{name}/{dtype}/fnv", hashes)
    w.close()


def write_adafactor(path):
    idx = sample_indices()
    w = Writer(path)
    for name, kwargs, wd, dtypes in ADAFACTOR_RUNS:
        for dtype in dtypes:
            factory = lambda ps: Adafactor(groups(ps, wd), **kwargs)
            params, opt = run(factory, dtype == "bf16")
            w.floats(f"adafactor/{name}/{dtype}/weights", flat(params)[idx])
            second = []
            for p in params:
                st = opt.state[p]
                second += [st["exp_avg_sq_row"], st["exp_avg_sq_col"]] if p.dim() >= 2 else [st["exp_avg_sq"]]
            w.floats(f"adafactor/{name}/{dtype}/second_moment", flat(second))
            if kwargs.get("beta1") is not None:
                w.floats(f"adafactor/{name}/{dtype}/exp_avg", flat([opt.state[p]["exp_avg"] for p in params])[idx])
    w.close()


def main():
    torch.set_num_threads(1)  # reductions in one fixed order
    os.makedirs(OUT, exist_ok=True)
    write_sgd(os.path.join(OUT, "optim_sgd.bin"))
    write_adafactor(os.path.join(OUT, "optim_adafactor.bin"))
    import transformers
    print(f"wrote {OUT}/optim_sgd.bin, optim_adafactor.bin (torch {torch.__version__}, "
          f"transformers {transformers.__version__}, {torch.__config__.show().count('AVX2') and 'AVX2' or 'no AVX2'})")


if __name__ == "__main__":
    main()
