"""Fault class `fused`: torch's fused fast paths (`nn.TransformerEncoder` nesting a padded input,
`nn.TransformerEncoderLayer`, `nn.MultiheadAttention` with need_weights=False), batch_first or not, norm_first or
not, with and without a padding mask, bf16 and fp16, each evaluated under no_grad (the fast paths' condition) and
tuned with `mpt check --checkpoint` after: the module outside any FP32 region with part of it kept FP32 by the
search (a fragile input offset, 1000 + signal, its bias compensating it) or an FP32 head after it, and the module
inside an FP32 region the model opens itself (`torch.autocast(enabled=False)`).
"""
from __future__ import annotations

from fault_harness import Case, tune_then_check
from fault_models import COSINE_HEADER, QUICK

CLASSES = ("fused",)

# --- fused: torch's fast paths. `frag`: what the search must keep FP32 (an input offset of 1000 the next bias
# cancels: bf16/fp16 rounding swamps the signal): "head" (a Linear after the module), "sa" (layer 0's
# self-attention), "sa_all" (every layer's self-attention), "ff" (layer 0's linear1). `own_fp32`: the module runs
# inside the model's own torch.autocast(enabled=False). `padded`: the metric counts the padded positions too.
FUSED_MODEL = """\
CFG = dict(kind=%(kind)r, mask=%(mask)r, norm_first=%(norm_first)r, batch_first=%(batch_first)r, frag=%(frag)r,
           own_fp32=%(own_fp32)r, padded=%(padded)r)
X = torch.randn(16, 6, 16, generator=torch.Generator().manual_seed(1))
MASK = torch.zeros(16, 6, dtype=torch.bool)
MASK[1::2, 4:] = True  # left aligned: the encoder nests its input
OFF = 1000.0
def example_inputs():
    return (X[:4],)
def _layer():
    return nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=CFG["batch_first"],
                                      norm_first=CFG["norm_first"])
class Model(nn.Module):
    def __init__(self):
        super().__init__()
        if CFG["kind"] == "encoder":
            self.body = nn.TransformerEncoder(_layer(), 2, enable_nested_tensor=True)
        elif CFG["kind"] == "layer":
            self.body = _layer()
        else:
            self.body = nn.MultiheadAttention(16, 2, batch_first=CFG["batch_first"])
        self.head = nn.Linear(16, 16)
    def run(self, x):
        m = MASK[: x.shape[0]] if CFG["mask"] else None
        if not CFG["batch_first"]:
            x = x.transpose(0, 1)
        if CFG["kind"] == "mha":
            y = self.body(x, x, x, key_padding_mask=m, need_weights=False)[0]
        else:
            y = self.body(x, src_key_padding_mask=m)
        return y if CFG["batch_first"] else y.transpose(0, 1)
    def forward(self, x):
        if CFG["frag"] in ("sa", "sa_all") and not (CFG["kind"] != "mha" and CFG["norm_first"]):
            x = x + OFF
        if CFG["own_fp32"]:
            with torch.autocast(x.device.type, enabled=False):
                y = self.run(x.float())
        else:
            y = self.run(x)
        return self.head(y + OFF) if CFG["frag"] == "head" else self.head(y)
def _fragile(m):
    layers = [m.body] if CFG["kind"] == "layer" else list(getattr(m.body, "layers", []))
    attns = [m.body] if CFG["kind"] == "mha" else [layer.self_attn for layer in layers]
    if CFG["frag"] == "head":
        m.head.bias.sub_(OFF * m.head.weight.sum(1))
    for i, attn in enumerate(attns[:1] if CFG["frag"] == "sa" else attns if CFG["frag"] == "sa_all" else []):
        attn.in_proj_bias.sub_(OFF * attn.in_proj_weight.sum(1))
        if CFG["kind"] != "mha" and CFG["norm_first"]:
            layers[i].norm1.bias.add_(OFF)
        elif CFG["frag"] == "sa_all" and i + 1 < len(layers):
            layers[i].norm2.bias.add_(OFF)  # the next layer's input
    if CFG["frag"] == "ff":
        (layers[0].norm2 if CFG["norm_first"] else layers[0].norm1).bias.add_(OFF)
        layers[0].linear1.bias.sub_(OFF * layers[0].linear1.weight.sum(1))
def build_model():
    torch.manual_seed(0)
    m = Model()
    with torch.no_grad():
        _fragile(m)
    return m.eval()
def evaluate(model):
    with torch.no_grad():
        out = model(X)
        ref = build_model()(X)
    keep = ~MASK if CFG["mask"] and not CFG["padded"] else torch.ones_like(MASK)
    return float(F.cosine_similarity(out[keep].flatten().float(), ref[keep].flatten(), dim=0))
"""
FUSED_DEFAULTS = {"mask": True, "norm_first": False, "batch_first": True, "frag": "head", "own_fp32": False,
                  "padded": False}
# name -> (dtypes, the model's settings)
FUSED_CASES: dict[str, tuple[tuple[str, ...], dict[str, object]]] = {
    "TransformerEncoder, padding mask, every layer's self-attention kept FP32": (
        ("bf16", "fp16"), {"kind": "encoder", "frag": "sa_all"}),
    "TransformerEncoder, padding mask, layer 0's self-attention kept FP32": (("fp16",), {"kind": "encoder",
                                                                                        "frag": "sa"}),
    "TransformerEncoder, padding mask, layer 0's linear1 kept FP32": (("bf16",), {"kind": "encoder", "frag": "ff"}),
    "TransformerEncoder, padding mask, FP32 head after it": (("bf16",), {"kind": "encoder"}),
    "TransformerEncoder, padding mask, FP32 head after it, metric over the padded positions too": (
        ("bf16",), {"kind": "encoder", "padded": True}),
    "TransformerEncoder, padding mask, in the model's own FP32 region": (
        ("bf16", "fp16"), {"kind": "encoder", "own_fp32": True}),
    "TransformerEncoder, padding mask, layer 0's self-attention fragile, in the model's own FP32 region": (
        ("bf16",), {"kind": "encoder", "frag": "sa", "own_fp32": True}),
    "TransformerEncoder, no mask, in the model's own FP32 region": (
        ("bf16",), {"kind": "encoder", "mask": False, "own_fp32": True}),
    "TransformerEncoder norm_first, padding mask, in the model's own FP32 region": (
        ("bf16",), {"kind": "encoder", "norm_first": True, "own_fp32": True}),
    "TransformerEncoder batch_first=False, padding mask, in the model's own FP32 region": (
        ("bf16",), {"kind": "encoder", "batch_first": False, "own_fp32": True}),
    "TransformerEncoderLayer, padding mask, in the model's own FP32 region": (
        ("bf16",), {"kind": "layer", "own_fp32": True}),
    "TransformerEncoderLayer norm_first, no mask, in the model's own FP32 region": (
        ("bf16",), {"kind": "layer", "mask": False, "norm_first": True, "own_fp32": True}),
    "MultiheadAttention, key padding mask, in the model's own FP32 region": (
        ("bf16", "fp16"), {"kind": "mha", "own_fp32": True}),
    "MultiheadAttention, no mask, in the model's own FP32 region": (
        ("bf16",), {"kind": "mha", "mask": False, "own_fp32": True}),
    "MultiheadAttention batch_first=False, key padding mask, in the model's own FP32 region": (
        ("bf16",), {"kind": "mha", "batch_first": False, "own_fp32": True}),
}


def cases() -> list[Case]:
    """Each fast-path setting in its dtypes, tuned then checked."""
    head = COSINE_HEADER.split("X = ")[0]  # the imports: the model file has its own data and evaluate
    return [tune_then_check(f"fused: {name}, {dtype}", ("--dtype", dtype, *QUICK), 0,
                            head + "\n" + FUSED_MODEL % {**FUSED_DEFAULTS, **settings})
            for name, (dtypes, settings) in FUSED_CASES.items() for dtype in dtypes]
