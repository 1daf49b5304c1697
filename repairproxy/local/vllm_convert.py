"""Convert the embedded GGUF into a bf16 safetensors checkpoint that vLLM on CPU can load.

vLLM 0.32 no longer loads GGUF on CPU (its GGUF plugin needs CUDA/Triton), so the Q4_K_M file is
dequantized by transformers (``gguf_file=``) and saved as bf16 safetensors, with the tokenizer and
the GGUF's own tool-aware chat template beside it. The weights are the Q4_K_M values widened to
bf16, not the original bf16 release: the arm is named ``bf16-from-q4_k_m`` for that reason.

Run by the vLLM venv's interpreter as a file (``python vllm_convert.py GGUF OUT``); it imports only
the standard library, torch and transformers, never the rest of this package.
"""

from __future__ import annotations

import json
import resource
import sys
import time
from pathlib import Path

__all__ = ["convert"]


def _log(message: str) -> None:
    print(f"[convert] {message}", file=sys.stderr, flush=True)


def convert(gguf: Path, out: Path) -> dict[str, object]:
    """Write ``out`` (config, bf16 safetensors, tokenizer, chat template); returns figures."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    started = time.perf_counter()
    _log(f"reading the tokenizer and chat template from {gguf.name}")
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    _log("dequantizing the weights to bf16 (about 1-2 min, ~6 GB of memory)")
    model = AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, dtype=torch.bfloat16
    )
    loaded = time.perf_counter() - started
    # The GGUF's quantizer describes the file read, not the checkpoint written (the weights are
    # plain bf16 tensors now): transformers refuses to save a "GGUF-quantized" model, and vLLM
    # would look for a GGUF quantizer and refuse the bf16 weights.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    out.mkdir(parents=True, exist_ok=True)
    _log(f"saving bf16 safetensors into {out}")
    model.save_pretrained(str(out), safe_serialization=True)
    tokenizer.save_pretrained(str(out))
    template = getattr(tokenizer, "chat_template", None)
    if not isinstance(template, str) or "tools" not in template:
        raise SystemExit(f"{gguf.name} carries no tool-aware chat template; vLLM needs one")
    (out / "chat_template.jinja").write_text(template, encoding="utf-8")
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {
        "load_seconds": round(loaded, 1),
        "seconds": round(time.perf_counter() - started, 1),
        "peak_rss_bytes": peak_kib * 1024,
        "torch": torch.__version__,
        "transformers": __import__("transformers").__version__,
        "parameters": sum(p.numel() for p in model.parameters()),
    }


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print("usage: python vllm_convert.py GGUF OUT_DIR", file=sys.stderr)
        return 2
    figures = convert(Path(argv[1]), Path(argv[2]))
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
