"""Does the reported lower-precision share hold for transformers' own architectures through `hf:`, zero-code?

    .venv/bin/python benchmarks/hf_architectures.py --threads 1                       # every architecture, bf16+fp16
    .venv/bin/python benchmarks/hf_architectures.py --only falcon,llama --dtypes bf16
    python benchmarks/hf_architectures.py --device cuda --quick                      # on a GPU (gpu_check.sh)

For each architecture (ARCHS: a tiny random-init model built from its config, hidden 32-64, 2 layers) and each
dtype (the model built in a subprocess, the rest in this process through mpt's own CLI entry point, so that
torch and transformers are imported once on a busy machine):

1. the model is built (seeded) and `save_pretrained` into a temp folder, with a calibration file beside it
   (`data.safetensors`: token ids and a padded attention mask, pixel values, or audio, as the model takes);
2. `mpt tune hf:DIR --data DATA --dtype D --device DEVICE --out OUT --no-latency --max-evals N --quiet` with the
   default metric (the one mpt chooses for the model's output; report.json and plan.yaml record it);
3. a runner loads the result as a user does, `tuner.load("hf:DIR", OUT)` (moved to DEVICE), runs the data's first
   batch (the
   inputs the report's share is counted on) under a TorchDispatchMode and counts the matmul/conv FLOPs of every
   ATen matmul/conv/attention call (`tuner.measure.deployed.GEMMS`, FLOPs by `tuner.measure.flops.aten_flops`)
   by the dtype it computed in (its output's): the ATen share;
4. `mpt check OUT --device DEVICE` (the plan re-evaluated): its exit.

`--quick` runs QUICK (a dense decoder, the two MoE decoders, an encoder, a seq2seq and a vision model) in bf16.

A row PASSes when the tune wrote a plan (exit 0, or 3 with the best plan kept), the report's
`low_precision_flop_share` equals the ATen share (to 1e-9) and `mpt check` exits 0. Prints one table
(architecture, dtype, metric, reported share, ATen share, check exit, PASS/FAIL); --out writes it too
(markdown; JSON when the name ends in .json). Exit 1 when a row fails.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

DTYPES = ("bf16", "fp16")
SHARE_TOL = 1e-9
VOCAB, SEQ, SAMPLES = 128, 12, 16
TEXT = dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
            max_position_embeddings=64)
DECODER = dict(TEXT, num_key_value_heads=2)  # grouped-query attention where the architecture has it
IMAGE = dict(image_size=32, num_channels=3)


@dataclass(frozen=True)
class Arch:
    """One architecture: transformers' config and model class names, the config's keyword arguments, and the
    inputs it takes (`text`, `seq2seq`, `image`, `audio`, `speech`)."""

    name: str
    config: str
    model: str
    kwargs: dict = field(default_factory=dict)
    inputs: str = "text"


ARCHS = [
    Arch("llama", "LlamaConfig", "LlamaForCausalLM", DECODER),
    Arch("mistral", "MistralConfig", "MistralForCausalLM", DECODER),
    Arch("qwen2", "Qwen2Config", "Qwen2ForCausalLM", DECODER),
    Arch("qwen3", "Qwen3Config", "Qwen3ForCausalLM", dict(DECODER, head_dim=8)),
    Arch("mixtral", "MixtralConfig", "MixtralForCausalLM", dict(DECODER, num_local_experts=4, num_experts_per_tok=2)),
    Arch("qwen2-moe", "Qwen2MoeConfig", "Qwen2MoeForCausalLM",
         dict(DECODER, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
              shared_expert_intermediate_size=64, decoder_sparse_step=1)),
    Arch("gemma", "GemmaConfig", "GemmaForCausalLM", dict(DECODER, head_dim=8)),
    Arch("phi", "PhiConfig", "PhiForCausalLM", TEXT),
    Arch("phi3", "Phi3Config", "Phi3ForCausalLM", dict(DECODER, pad_token_id=0)),
    Arch("stablelm", "StableLmConfig", "StableLmForCausalLM", DECODER),
    Arch("olmo", "OlmoConfig", "OlmoForCausalLM", DECODER),
    Arch("starcoder2", "Starcoder2Config", "Starcoder2ForCausalLM", DECODER),
    Arch("granite", "GraniteConfig", "GraniteForCausalLM", DECODER),
    Arch("falcon", "FalconConfig", "FalconForCausalLM",
         dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4)),  # multi-query
    Arch("falcon-gqa", "FalconConfig", "FalconForCausalLM",
         dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_kv_heads=2,
              new_decoder_architecture=True)),
    Arch("gpt2", "GPT2Config", "GPT2LMHeadModel", dict(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4,
                                                       n_positions=64)),
    Arch("gpt_bigcode", "GPTBigCodeConfig", "GPTBigCodeForCausalLM",
         dict(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=64, multi_query=True)),
    Arch("gpt_neox", "GPTNeoXConfig", "GPTNeoXForCausalLM", TEXT),
    Arch("gptj", "GPTJConfig", "GPTJForCausalLM", dict(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4,
                                                       n_positions=64, rotary_dim=4)),
    Arch("opt", "OPTConfig", "OPTForCausalLM", dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2,
                                                    num_attention_heads=4, ffn_dim=64, max_position_embeddings=64,
                                                    word_embed_proj_dim=32)),
    Arch("bloom", "BloomConfig", "BloomForCausalLM", dict(vocab_size=VOCAB, hidden_size=32, n_layer=2, n_head=4)),
    Arch("codegen", "CodeGenConfig", "CodeGenForCausalLM", dict(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4,
                                                                n_positions=64, rotary_dim=4)),
    Arch("bert", "BertConfig", "BertForSequenceClassification", dict(TEXT, num_labels=3)),
    Arch("bert-mlm", "BertConfig", "BertForMaskedLM", TEXT),
    Arch("roberta", "RobertaConfig", "RobertaForMaskedLM", dict(TEXT, pad_token_id=1)),
    Arch("distilbert", "DistilBertConfig", "DistilBertForSequenceClassification",
         dict(vocab_size=VOCAB, dim=32, n_layers=2, n_heads=4, hidden_dim=64, max_position_embeddings=64)),
    Arch("albert", "AlbertConfig", "AlbertForMaskedLM", dict(TEXT, embedding_size=16)),
    Arch("electra", "ElectraConfig", "ElectraForPreTraining", dict(TEXT, embedding_size=32)),
    Arch("deberta-v2", "DebertaV2Config", "DebertaV2ForTokenClassification", dict(TEXT, num_labels=5)),
    Arch("mpnet", "MPNetConfig", "MPNetForMaskedLM", TEXT),
    Arch("xlm-roberta", "XLMRobertaConfig", "XLMRobertaForSequenceClassification", dict(TEXT, pad_token_id=1)),
    Arch("t5", "T5Config", "T5ForConditionalGeneration", dict(vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=64,
                                                              num_layers=2, num_heads=4), "seq2seq"),
    Arch("bart", "BartConfig", "BartForConditionalGeneration",
         dict(vocab_size=VOCAB, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
              decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=64),
         "seq2seq"),
    Arch("marian", "MarianConfig", "MarianMTModel",
         dict(vocab_size=VOCAB, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
              decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=64,
              decoder_start_token_id=0, pad_token_id=0), "seq2seq"),
    Arch("vit", "ViTConfig", "ViTForImageClassification", dict(IMAGE, hidden_size=32, num_hidden_layers=2,
                                                               num_attention_heads=4, intermediate_size=64,
                                                               patch_size=8, num_labels=4), "image"),
    Arch("deit", "DeiTConfig", "DeiTForImageClassification", dict(IMAGE, hidden_size=32, num_hidden_layers=2,
                                                                  num_attention_heads=4, intermediate_size=64,
                                                                  patch_size=8, num_labels=4), "image"),
    Arch("convnext", "ConvNextConfig", "ConvNextForImageClassification",
         dict(num_channels=3, hidden_sizes=[16, 32], depths=[1, 1], num_stages=2, num_labels=4), "image"),
    Arch("resnet", "ResNetConfig", "ResNetForImageClassification",
         dict(num_channels=3, embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1], num_labels=4), "image"),
    Arch("swin", "SwinConfig", "SwinForImageClassification",
         dict(IMAGE, patch_size=4, embed_dim=16, depths=[1, 1], num_heads=[2, 4], window_size=4, num_labels=4),
         "image"),
    Arch("segformer", "SegformerConfig", "SegformerForSemanticSegmentation",
         dict(num_channels=3, num_encoder_blocks=2, depths=[1, 1], sr_ratios=[2, 1], hidden_sizes=[16, 32],
              num_attention_heads=[1, 2], decoder_hidden_size=32, num_labels=4), "image"),
    Arch("wav2vec2", "Wav2Vec2Config", "Wav2Vec2ForSequenceClassification",
         dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
              conv_dim=(16, 16), conv_stride=(5, 4), conv_kernel=(10, 8), num_conv_pos_embeddings=16,
              num_conv_pos_embedding_groups=2, num_labels=3), "audio"),
]
BY_NAME = {a.name: a for a in ARCHS}
QUICK = ("llama", "mixtral", "qwen2-moe", "bert", "t5", "vit")  # --quick: one of each kind, the MoE decoders both


def build(arch: Arch, folder: Path) -> None:
    """The tiny model (seed 0) saved into `folder/model`, its calibration data into `folder/data.safetensors`."""
    import torch
    import transformers
    from safetensors.torch import save_file

    torch.manual_seed(0)
    config = getattr(transformers, arch.config)(**arch.kwargs)
    getattr(transformers, arch.model)(config).eval().save_pretrained(folder / "model")
    g = torch.Generator().manual_seed(1)
    if arch.inputs in ("text", "seq2seq"):
        ids = torch.randint(2, VOCAB, (SAMPLES, SEQ), generator=g)
        mask = torch.ones_like(ids)
        mask[::2, SEQ - 3:] = 0  # every other sample padded
        data = {"input_ids": ids, "attention_mask": mask}
        if arch.inputs == "seq2seq":
            data["decoder_input_ids"] = torch.randint(2, VOCAB, (SAMPLES, SEQ - 4), generator=g)
    elif arch.inputs == "image":
        data = {"pixel_values": torch.randn(SAMPLES, 3, 32, 32, generator=g)}
    else:
        data = {"input_values": torch.randn(SAMPLES, 1600, generator=g)}
    save_file(data, folder / "data.safetensors")


def count(folder: Path, out: Path, batch: int, device: str = "cpu") -> dict:
    """`tuner.load("hf:folder/model", out)` on `device` run on the data's first batch: matmul/conv FLOPs by ATen call
    dtype."""
    import torch
    from safetensors.torch import load_file
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves

    import tuner
    from tuner.measure.deployed import GEMMS
    from tuner.measure.flops import aten_flops

    loaded = tuner.load(f"hf:{folder / 'model'}", out).to(device)
    inputs = {k: v[:batch].to(device) for k, v in load_file(folder / "data.safetensors").items()}
    by_dtype: dict[str, int] = {}
    by_op: dict[str, dict[str, int]] = {}

    class Count(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            result = func(*args, **kwargs)
            name = func.overloadpacket.__name__
            if name in GEMMS:
                first = next((t for t in tree_leaves(result) if isinstance(t, torch.Tensor)
                              and t.is_floating_point()), None)
                dtype = str(first.dtype).replace("torch.", "") if first is not None else "none"
                flops = aten_flops(name, args, kwargs, result)
                by_dtype[dtype] = by_dtype.get(dtype, 0) + flops
                by_op.setdefault(name, {})[dtype] = by_op.setdefault(name, {}).get(dtype, 0) + flops
            return result

    with torch.no_grad(), torch.random.fork_rng(devices=[]), Count():
        torch.manual_seed(0)
        loaded(**inputs)
    total = sum(by_dtype.values())
    low = by_dtype.get("bfloat16", 0) + by_dtype.get("float16", 0)
    return {"aten_share": low / total if total else 0.0, "by_op": by_op}


def _run(cmd: list[str], env: dict, timeout: float, log: Path) -> tuple[int, str]:
    try:
        res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
        rc, text = res.returncode, res.stdout + res.stderr
    except subprocess.TimeoutExpired as exc:
        rc, text = 124, f"timed out after {timeout:.0f} s: {exc.stdout or ''}{exc.stderr or ''}"
    log.write_text(text)
    return rc, text


def _mpt(argv: list[str], log: Path) -> tuple[int, str]:
    """`mpt ARGV` in this process (click's runner: the exit code and the output)."""
    from click.testing import CliRunner

    from mpt_cli.main import main

    res = CliRunner().invoke(main, argv)
    text = res.output + ("".join(__import__("traceback").format_exception(res.exc_info[1]))
                         if res.exc_info and not isinstance(res.exc_info[1], SystemExit) else "")
    log.write_text(text)
    return res.exit_code, text


def _tail(text: str, n: int = 2) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return " / ".join(lines[-n:])[:160]


def check_one(arch: Arch, dtype: str, args: argparse.Namespace, work: Path, env: dict) -> dict:
    """One row: build (once per architecture), tune, count, check."""
    row: dict = {"arch": arch.name, "model": arch.model, "dtype": dtype}
    folder = work / arch.name
    me = [sys.executable, str(Path(__file__).resolve())]
    if not (folder / "data.safetensors").is_file():
        rc, text = _run([*me, "--build", arch.name, str(folder)], env, args.child_timeout, work / f"{arch.name}.log")
        if rc != 0:
            row["error"] = f"build exit {rc}: {_tail(text)}"
            return row
    out = work / f"{arch.name}-{dtype}"
    t0 = time.perf_counter()
    rc, text = _mpt(["tune", f"hf:{folder / 'model'}", "--data", str(folder / "data.safetensors"), "--dtype", dtype,
                     "--device", args.device, "--out", str(out), "--overwrite", "--no-latency", "--max-evals",
                     str(args.max_evals), "--quiet"],
                    work / f"{arch.name}-{dtype}.tune.log")
    row.update(tune_rc=rc, tune_s=time.perf_counter() - t0)
    if not (out / "report.json").is_file():
        row["error"] = f"mpt tune exit {rc}: {_tail(text)}"
        return row
    report = json.loads((out / "report.json").read_text())
    import yaml

    plan = yaml.safe_load((out / "plan.yaml").read_text())
    row.update(metric=(plan.get("model") or {}).get("metric"), report_share=report.get("low_precision_flop_share"))
    try:
        row.update(count(folder, out, args.batch, args.device))
    except Exception as exc:  # noqa: BLE001 - the row says what failed
        row["error"] = f"count: {type(exc).__name__}: {str(exc)[:120]}"
    rc, text = _mpt(["check", str(out), "--device", args.device], work / f"{arch.name}-{dtype}.check.log")
    row["check_rc"] = rc
    if rc != 0:
        row["check_tail"] = _tail(text)
    row["share_ok"] = (row.get("aten_share") is not None and row.get("report_share") is not None
                       and abs(row["aten_share"] - row["report_share"]) <= SHARE_TOL)
    row["passed"] = row["share_ok"] and row["check_rc"] == 0 and row["tune_rc"] in (0, 3)
    return row


def _pct(x) -> str:
    return "-" if x is None else f"{100 * x:.4f}%"


HEADERS = ["architecture", "dtype", "metric", "reported share", "ATen share", "check exit", "result"]


def table_row(r: dict) -> list[str]:
    arch = f"{r['arch']} ({r['model']})"
    if "passed" not in r:
        return [arch, r["dtype"], r.get("metric") or "-", _pct(r.get("report_share")), "-", "-",
                f"FAIL: {r.get('error', '')[:70]}"]
    return [arch, r["dtype"], r.get("metric") or "-", _pct(r.get("report_share")), _pct(r.get("aten_share")),
            str(r["check_rc"]), "PASS" if r["passed"] else "FAIL"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", action="append", default=[], help="architecture(s), comma-separated or repeated: "
                    + ", ".join(BY_NAME))
    ap.add_argument("--dtypes", help="comma-separated: bf16,fp16 (default both; bf16 with --quick)")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="where to tune, load and check")
    ap.add_argument("--quick", action="store_true", help=f"only {', '.join(QUICK)} (unless --only), in bf16")
    ap.add_argument("--threads", type=int, help="OMP_NUM_THREADS for the children")
    ap.add_argument("--max-evals", type=int, default=6, help="mpt tune --max-evals (default 6)")
    ap.add_argument("--batch", type=int, default=8, help="the tune's --batch-size (default 8: mpt's default)")
    ap.add_argument("--child-timeout", type=float, default=900.0)
    ap.add_argument("--work", type=Path, help="keep the folders, outputs and logs here (default: a temp folder)")
    ap.add_argument("--out", type=Path, help="also write the table here (markdown; JSON when it ends in .json)")
    ap.add_argument("--build", help=argparse.SUPPRESS)
    ap.add_argument("--count", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("paths", nargs="*", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.build:
        build(BY_NAME[args.build], Path(args.paths[0]))
        return 0
    if args.count:
        print(json.dumps(count(Path(args.paths[0]), Path(args.paths[1]), args.batch, args.device)))
        return 0
    names = [n.strip() for part in args.only for n in part.split(",") if n.strip()] or \
        list(QUICK if args.quick else BY_NAME)
    unknown = [n for n in names if n not in BY_NAME]
    if unknown:
        ap.error(f"unknown architecture(s) {unknown}; known: {', '.join(BY_NAME)}")
    dtypes = [d.strip() for d in (args.dtypes or ("bf16" if args.quick else ",".join(DTYPES))).split(",") if d.strip()]
    from _common import child_pythonpath, machine_line, table

    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_VERBOSITY="error", PYTHONPATH=child_pythonpath())
    if args.threads:
        env["OMP_NUM_THREADS"] = str(args.threads)
    os.environ.update(HF_HUB_OFFLINE="1", TRANSFORMERS_VERBOSITY="error")
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)

    if args.device == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda: torch.cuda.is_available() is False on this machine")
    card = f"; {torch.cuda.get_device_name()}" if args.device == "cuda" else ""
    print(machine_line() + f"; cpu capability {torch.backends.cpu.get_cpu_capability()}{card}")
    print(f"architectures {', '.join(names)}; dtypes {', '.join(dtypes)}; device {args.device}; "
          f"--max-evals {args.max_evals}\n",
          flush=True)
    t0 = time.perf_counter()
    tmp = None
    if args.work:
        work = args.work.resolve()
        work.mkdir(parents=True, exist_ok=True)
    else:
        tmp = tempfile.TemporaryDirectory(prefix="mpt-hf-archs-")
        work = Path(tmp.name)
    rows = []
    try:
        for dtype in dtypes:
            for name in names:
                r = check_one(BY_NAME[name], dtype, args, work, env)
                rows.append(r)
                print(" | ".join(table_row(r)) + f"  ({r.get('tune_s', 0):.0f} s)", flush=True)
                if r.get("check_tail"):
                    print(f"    mpt check: {r['check_tail']}")
                if r.get("by_op") and not r.get("share_ok"):
                    print(f"    ATen FLOPs by op and dtype: {r['by_op']}")
    finally:
        if tmp is not None:
            tmp.cleanup()
    md = table(HEADERS, [table_row(r) for r in rows])
    print()
    print(md)
    failed = [r for r in rows if not r.get("passed")]
    print(f"\n{len(rows) - len(failed)} of {len(rows)} rows pass; {time.perf_counter() - t0:.0f} s")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        if args.out.suffix == ".json":
            args.out.write_text(json.dumps({"machine": machine_line(), "rows": rows}, indent=2, default=str) + "\n")
        else:
            args.out.write_text("\n".join(["# transformers architectures through hf:", "", f"- {machine_line()}",
                                           "", md, ""]))
        print(f"wrote {args.out}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
