"""test/oracle_moe.py — writes the Mixture-of-Experts fixtures test_moe_layer imports: Hugging Face's
own MoE layers, with their outputs, auxiliary losses and every gradient, in fp32.

Two layers, N=24 tokens (one sequence), C=32 channels, E=4 experts, H=64 hidden units per expert:
  test/fixtures/moe_switch.safetensors   SwitchTransformersSparseMLP: top-1, the raw top-1
      probability as the token's weight, experts x -> wo(gelu_new(wi x)) without biases (dropout 0,
      no router jitter, no router bias, expert_capacity = N so that nothing is dropped)
  test/fixtures/moe_mixtral.safetensors  MixtralSparseMoeBlock: top-2, weights renormalized to sum 1,
      SwiGLU experts w2(silu(w1 x) * w3 x)
Tensors (all F32; our layout, which the layer uses directly):
  x (N,C), dy (N,C)            the layer's input and the upstream gradient of its output
  router (E,C)                 the router's weight (Switch's classifier, Mixtral's gate)
  w1 (E,H1,C)                  the first expert GEMM: Switch's wi (H1 = H); Mixtral's w1 (gate, rows
                               [0,H)) stacked over w3 (up, rows [H,2H)): H1 = 2H
  w2 (E,C,H)                   Switch's wo, Mixtral's w2
  y (N,C), logits (N,E)        transformers' output and router logits
  aux, z (scalars)             alpha * transformers' load-balancing loss, beta * its z-loss
  alpha, beta (scalars)        the layer's coefficients for the same losses (see below)
  dx, drouter, dw1, dw2        gradients of  L = sum(y * dy) + aux + z
Inputs and weights are rounded to bf16-representable values, so a bf16 run of the layer starts
from exactly these numbers. The seed is the first whose routing is far from any tie (every token's
K-th logit exceeds its (K+1)-th by at least MARGIN), so rounding cannot change which experts a
token picks, and which gives every expert a token.

Loss conventions. Switch's load_balancing_loss_func is E^2 * mean_e(f_e P_e) = E * sum_e f_e P_e,
the layer's aux at alpha = 1. Mixtral's counts f_e per token (fraction of tokens with e among their
K choices): K times the layer's (which counts per assignment), so the layer's alpha is K times the
weight given to Mixtral's loss. The z-loss is Switch's router_z_loss_func (mean of logsumexp^2), the
layer's z at beta = 1; Mixtral has none, so the same function is applied to its router logits.

Regenerate (needs torch and transformers; Debian's python3-torch + pip's transformers<4.46 work):
  /usr/bin/python3 test/oracle_moe.py
"""
import os

import torch
from safetensors.torch import save_file
from transformers import MixtralConfig, SwitchTransformersConfig
from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock
from transformers.models.mixtral.modeling_mixtral import load_balancing_loss_func as mixtral_aux
from transformers.models.switch_transformers.modeling_switch_transformers import (
    SwitchTransformersSparseMLP, load_balancing_loss_func as switch_aux, router_z_loss_func)

HERE = os.path.dirname(os.path.abspath(__file__))
N, C, E, H = 24, 32, 4, 64
AUX_WEIGHT, Z_WEIGHT = 0.5, 0.1  # large enough that the losses' gradients show beside sum(y * dy)
MARGIN = 0.05  # logit gap around the K-th choice; bf16 logits of this size err by about 2^-8


def bf16_exact(t):
    """t rounded to the nearest bf16 value, kept in fp32."""
    return t.to(torch.bfloat16).float()


def routing_is_clear(logits, k):
    """Whether every token's K-th logit beats its (K+1)-th by MARGIN and every expert gets a token."""
    top = logits.topk(k + 1, dim=-1)
    gap_ok = bool((top.values[:, k - 1] - top.values[:, k] >= MARGIN).all())
    return gap_ok and top.indices[:, :k].unique().numel() == E


def switch_case(seed):
    """The Switch layer with random weights, or None when its routing is not clear."""
    torch.manual_seed(seed)
    config = SwitchTransformersConfig(d_model=C, d_ff=H, num_experts=E, expert_capacity=N, dense_act_fn="gelu_new",
                                      dropout_rate=0.0, router_bias=False, router_jitter_noise=0.0,
                                      router_dtype="float32")
    layer = SwitchTransformersSparseMLP(config).float().eval()
    x = bf16_exact(torch.randn(N, C))
    with torch.no_grad():
        layer.router.classifier.weight.copy_(bf16_exact(0.2 * torch.randn(E, C)))
        for e in range(E):
            layer.experts[f"expert_{e}"].wi.weight.copy_(bf16_exact(torch.randn(H, C) / C ** 0.5))
            layer.experts[f"expert_{e}"].wo.weight.copy_(bf16_exact(torch.randn(C, H) / H ** 0.5))
        if not routing_is_clear(layer.router.classifier(x), 1):
            return None

    params = [layer.router.classifier.weight] + [layer.experts[f"expert_{e}"].wi.weight for e in range(E)] + \
             [layer.experts[f"expert_{e}"].wo.weight for e in range(E)]
    x.requires_grad_(True)
    y, (logits, expert_index) = layer(x[None])  # one group of N tokens
    aux = AUX_WEIGHT * switch_aux(torch.softmax(logits, dim=-1), expert_index)
    z = Z_WEIGHT * router_z_loss_func(logits)
    w1 = torch.stack([layer.experts[f"expert_{e}"].wi.weight for e in range(E)])
    w2 = torch.stack([layer.experts[f"expert_{e}"].wo.weight for e in range(E)])
    return finish(x, y[0], logits[0], aux, z, params, AUX_WEIGHT, w1, w2,
                  lambda g: (torch.stack(g[1:1 + E]), torch.stack(g[1 + E:])))


def mixtral_case(seed):
    """The Mixtral layer with random weights, or None when its routing is not clear."""
    torch.manual_seed(seed)
    config = MixtralConfig(hidden_size=C, intermediate_size=H, num_local_experts=E, num_experts_per_tok=2,
                           hidden_act="silu", router_jitter_noise=0.0)
    layer = MixtralSparseMoeBlock(config).float().eval()
    x = bf16_exact(torch.randn(N, C))
    with torch.no_grad():
        layer.gate.weight.copy_(bf16_exact(0.2 * torch.randn(E, C)))
        for ex in layer.experts:
            ex.w1.weight.copy_(bf16_exact(torch.randn(H, C) / C ** 0.5))
            ex.w3.weight.copy_(bf16_exact(torch.randn(H, C) / C ** 0.5))
            ex.w2.weight.copy_(bf16_exact(torch.randn(C, H) / H ** 0.5))
        if not routing_is_clear(layer.gate(x), 2):
            return None

    params = [layer.gate.weight] + [ex.w1.weight for ex in layer.experts] + [ex.w3.weight for ex in layer.experts] + \
             [ex.w2.weight for ex in layer.experts]
    x.requires_grad_(True)
    y, logits = layer(x[None])
    aux = AUX_WEIGHT * mixtral_aux((logits,), E, 2)
    z = Z_WEIGHT * router_z_loss_func(logits[None])
    w1 = torch.stack([torch.cat([ex.w1.weight, ex.w3.weight]) for ex in layer.experts])
    w2 = torch.stack([ex.w2.weight for ex in layer.experts])
    # The layer's alpha: Mixtral's loss is K = 2 times the layer's aux at the same weight.
    return finish(x, y[0], logits, aux, z, params, 2 * AUX_WEIGHT, w1, w2,
                  lambda g: (torch.stack([torch.cat([g[1 + e], g[1 + E + e]]) for e in range(E)]),
                             torch.stack(g[1 + 2 * E:])))


def finish(x, y, logits, aux, z, params, alpha, w1, w2, expert_grads):
    """The fixture's tensors: the forward's results and the gradients of sum(y * dy) + aux + z."""
    dy = bf16_exact(torch.randn(N, C))
    loss = (y * dy).sum() + aux + z
    grads = torch.autograd.grad(loss, [x] + params)
    dw1, dw2 = expert_grads(grads[1:])
    scalar = lambda v: torch.tensor(float(v))
    out = {"x": x, "dy": dy, "router": params[0], "w1": w1, "w2": w2, "y": y, "logits": logits, "aux": aux, "z": z,
           "alpha": scalar(alpha), "beta": scalar(Z_WEIGHT), "dx": grads[0], "drouter": grads[1], "dw1": dw1,
           "dw2": dw2}
    return {k: v.detach().float().contiguous() for k, v in out.items()}


def main():
    for name, case in (("moe_switch", switch_case), ("moe_mixtral", mixtral_case)):
        seed = 1
        tensors = case(seed)
        while tensors is None:
            seed += 1
            tensors = case(seed)
        path = os.path.join(HERE, "fixtures", name + ".safetensors")
        save_file(tensors, path)
        print(f"wrote {path} (seed {seed}): |y| max {tensors['y'].abs().max():.4f}, aux {tensors['aux']:.5f}, "
              f"z {tensors['z']:.5f}; transformers {__import__('transformers').__version__}, torch {torch.__version__}")


if __name__ == "__main__":
    main()
