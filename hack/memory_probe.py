"""Memory probe of issue #30 part 4, as run on the lent H200 on 2026-11-27 (two short runs).

Which SDPA backend torchvision's ViT-B/16 trains with in fp32 and bf16 (the default's peak
against each forced backend's), ResNet-50's fp32 training peak at batch 128 and 256 (the A10
fit case), max_memory_reserved against max_memory_allocated (the allocator's reserve), and
Hugging Face GPT-2's inference peak with and without its KV cache. Prints one JSON list a case.

    python hack/memory_probe.py
"""
import contextlib
import json

import torch
import torch.nn.functional as F
import torchvision
from torch.nn.attention import SDPBackend, sdpa_kernel

torch.backends.cuda.matmul.allow_tf32 = False  # "fp32" as model_steps runs it
torch.backends.cudnn.allow_tf32 = False
KERNELS = {"default": contextlib.nullcontext, "efficient": lambda: sdpa_kernel(
    [SDPBackend.EFFICIENT_ATTENTION]), "math": lambda: sdpa_kernel([SDPBackend.MATH]),
    "flash": lambda: sdpa_kernel([SDPBackend.FLASH_ATTENTION])}


def train_peaks(model, x, y, autocast, kernel):
    """(max allocated, max reserved) over two steady AdamW steps after two warm-up steps."""
    opt = torch.optim.AdamW(model.parameters())

    def step():
        with autocast(), kernel():
            loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(2):
        step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    for _ in range(2):
        step()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved()


CASES = [("vit_b_16", 32, "fp32", "default"), ("vit_b_16", 32, "fp32", "efficient"),
         ("vit_b_16", 32, "fp32", "math"), ("vit_b_16", 32, "bf16", "default"),
         ("vit_b_16", 32, "bf16", "flash"), ("vit_b_16", 32, "bf16", "efficient"),
         ("vit_b_16", 64, "fp32", "default"), ("vit_b_16", 64, "bf16", "default"),
         ("resnet50", 128, "fp32", "default"), ("resnet50", 256, "fp32", "default")]
for arch, batch, precision, kernel in CASES:
    with torch.device("cuda"):
        model = getattr(torchvision.models, arch)(weights=None).train()
    x = torch.randn(batch, 3, 224, 224, device="cuda")
    y = torch.randint(0, 1000, (batch,), device="cuda")
    autocast = ((lambda: torch.autocast("cuda", dtype=torch.bfloat16)) if precision == "bf16"
                else contextlib.nullcontext)
    print(json.dumps([arch, batch, precision, kernel,
                      train_peaks(model, x, y, autocast, KERNELS[kernel])]), flush=True)
    model = x = y = None
    torch.cuda.empty_cache()

import transformers  # noqa: E402

config = transformers.AutoConfig.for_model("gpt2", n_layer=12, n_embd=768, n_head=12,
                                           n_positions=1024, vocab_size=50257)
with torch.device("cuda"):
    gpt2 = transformers.AutoModelForCausalLM.from_config(config).eval()
ids = torch.randint(0, 50257, (4, 512), device="cuda")
for use_cache in (True, False):
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    with torch.no_grad():
        gpt2(input_ids=ids, use_cache=use_cache)
    torch.cuda.synchronize()
    print(json.dumps(["gpt2-small b4 s512 fp32 inference, use_cache", use_cache,
                      torch.cuda.max_memory_allocated()]), flush=True)
