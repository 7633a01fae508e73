"""GpuPort's official side: Hugging Face ``transformers``' GPT-2, unchanged.

The reference code is the library itself; this package only plays the part
of the checkpoint. A real port would download weights; here the weights are
drawn from fixed seeds so the example needs no network and no files, and
every rank of a distributed test rebuilds exactly the same model.
"""

import torch

__all__ = ["OFFICIAL_CONFIG", "official_config", "build_official"]

# Small enough to build in well under a second, large enough (a 256-wide
# residual, 1024-wide MLP, 512 positions) that each forward is real GPU work
# rather than pure kernel-launch latency.
OFFICIAL_CONFIG = dict(
    vocab_size=4096,
    n_positions=512,
    n_embd=256,
    n_layer=2,
    n_head=4,
    activation_function="gelu_new",
    layer_norm_epsilon=1e-5,
    # Dropout off: parity is checked in eval mode, and a zero probability
    # also keeps the model deterministic if someone forgets .eval().
    resid_pdrop=0.0,
    embd_pdrop=0.0,
    attn_pdrop=0.0,
    # GPT-2's defaults (50256) lie outside this small vocabulary.
    bos_token_id=0,
    eos_token_id=0,
)


def official_config():
    from transformers import GPT2Config

    return GPT2Config(**OFFICIAL_CONFIG)


def build_official(device, seed=0):
    """The official ``GPT2Model`` with seeded weights, in eval mode on ``device``.

    ``GPT2Model``'s own init leaves every bias at 0 and every LayerNorm at
    (1, 0); a mapping that dropped or swapped those tensors would still pass.
    So every parameter is then moved by seeded noise, in name order, which
    makes each one matter.
    """
    from transformers import GPT2Model

    # fork_rng: building the reference must not reseed the caller's RNG.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = GPT2Model(official_config())
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for _, p in sorted(model.named_parameters()):
            p.add_(0.02 * torch.randn(p.shape, generator=gen, dtype=p.dtype))
    return model.to(device).eval()
