"""The reference for the GPU bench's torchtitan ratio: torchtitan's own trainer on a preset's shape.

torchtitan (its PyPI release, pinned in bench/torchtitan-requirements.txt) runs
its ``llama3`` model through its own trainer: its FSDP2 wrapping, its
mixed-precision policy (bf16 parameters, fp32 reduction: the trainer's), its
loss, data loader and AdamW. Only the inputs are ours, so that no hub download
is needed: the model's shape comes from our preset, the tokenizer is the
embedded one and the documents are the embedded corpus. Run under torchrun;
rank 0 prints one ``BENCH_RESULT {json}`` line::

    torchrun --standalone --nproc-per-node gpu bench/torchtitan_llama.py --preset llama3.2-1b --precision bf16
    python bench/torchtitan_llama.py --preset llama3.2-1b --check-shape

torchtitan's releases follow torch's. 0.2.2 is the one that runs both where
this bench is tested (torch 2.15, pinned here) and on the GPU machine it is
made for (torch 2.11); 0.3 imports FSDP names that torch 2.11 lacks. In 0.2.2
the model is a flavor registered with the preset's numbers, attention is SDPA
with a causal mask and the loss the plain cross-entropy, like the trainer with
``training.logits: full``. 0.2.2 has no tied Llama, so the head is untied
(``--check-shape`` prints both counts): more memory for parameters, gradients
and AdamW state, the same FLOPs.

On the CPU (the bench's dry run) what torchtitan does not support there is
replaced, and only there: its device module (it assumes an accelerator) and
the reduce-scatter's pre-multiplied sum (gloo has none: a plain sum, the same
arithmetic at the divide factor 1 torchtitan sets).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import resource
import sys
import time
import types
from typing import Any

import torch

SUPPORTED = "0.2."  # bench/torchtitan-requirements.txt pins the release


def require_release() -> None:
    """One line, not a traceback deep in torchtitan, when another release is installed."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        found = version("torchtitan")
    except PackageNotFoundError:
        raise SystemExit(
            "torchtitan is not installed: pip install --no-deps -r bench/torchtitan-requirements.txt"
        ) from None
    if not found.startswith(SUPPORTED):
        raise SystemExit(f"torchtitan {found} is installed; this bench drives {SUPPORTED}x (see its docstring)")


def _cpu_stand_ins() -> None:
    """What torchtitan lacks on the CPU, replaced before its trainer is imported (dry run only)."""
    import torchtitan.tools.utils as titan_utils
    from torch.distributed.fsdp import FSDPModule

    cpu = types.SimpleNamespace(
        set_device=lambda _device: None,
        current_device=lambda: 0,
        device_count=lambda: 1,
        synchronize=lambda *_: None,
        get_device_name=lambda *_: "cpu",
        get_device_properties=lambda *_: types.SimpleNamespace(total_memory=1),
        memory_stats=lambda *_: {},
        reset_peak_memory_stats=lambda *_: None,
        empty_cache=lambda: None,
    )
    # Modules imported with torchtitan's package already hold their own copies of the two names.
    for name, module in list(sys.modules.items()):
        if name.startswith("torchtitan") and hasattr(module, "device_type"):
            module.device_type, module.device_module = "cpu", cpu
    titan_utils.device_type, titan_utils.device_module = "cpu", cpu
    set_divide_factor = FSDPModule.set_gradient_divide_factor

    def plain_sum(module: FSDPModule, factor: float) -> None:
        set_divide_factor(module, factor)
        module.set_force_sum_reduction_for_comms(True)

    FSDPModule.set_gradient_divide_factor = plain_sum


def _without_tensorboard() -> None:
    """torchtitan's metrics module imports TensorBoard's writer at the top; its logging stays off here.

    The GPU machine has no TensorBoard (nor its protobuf and absl): a placeholder module lets
    the import succeed, and anything that did use it would fail loudly.
    """
    if importlib.util.find_spec("tensorboard") is None:
        placeholder = types.ModuleType("torch.utils.tensorboard")

        class SummaryWriter:
            def __init__(self, *_a: Any, **_kw: Any) -> None:
                raise RuntimeError("TensorBoard is not installed; torchtitan's TensorBoard logging is off here")

        placeholder.SummaryWriter = SummaryWriter  # type: ignore[attr-defined]
        sys.modules["torch.utils.tensorboard"] = placeholder


def _register_corpus(text_datasets: Any) -> str:
    """The embedded corpus as a torchtitan dataset (its registry of names), so no hub is needed."""
    from datasets import Dataset
    from fsdp_trainer.data.corpus import embedded_documents

    text_datasets.DATASETS["fsdp_embedded"] = text_datasets.DatasetConfig(
        path="embedded",
        loader=lambda _path: Dataset.from_list([{"text": text} for text in embedded_documents()]),
        sample_processor=lambda sample: sample["text"],
    )
    return "fsdp_embedded"


# --- torchtitan 0.2: one JobConfig, models from a flavor table ---------------------------


def titan_flavor(preset: str) -> Any:
    """torchtitan's model arguments with the preset's shape.

    0.2 derives the MLP's width from the hidden size: 8/3 of it, rounded up to a
    multiple. Taking the preset's own width as that multiple gives it exactly.
    """
    from fsdp_api.presets import PRESETS
    from torchtitan.models.llama3 import TransformerModelArgs

    d = PRESETS[preset]
    if d.intermediate_size < int(8 * d.hidden_size / 3):
        raise SystemExit(f"{preset}: an MLP narrower than 8/3 of the hidden size has no torchtitan flavor")
    return TransformerModelArgs(
        dim=d.hidden_size,
        n_layers=d.num_layers,
        n_heads=d.num_heads,
        n_kv_heads=d.num_key_value_heads,
        vocab_size=d.vocab_size,
        multiple_of=d.intermediate_size,
        rope_theta=d.rope_theta,
        max_seq_len=d.max_seq_len,
    )


def build_trainer(args: argparse.Namespace, workdir: str) -> Any:
    from fsdp_trainer.data.tokenizer import embedded_tokenizer_dir
    from torchtitan.config import JobConfig
    from torchtitan.hf_datasets import text_datasets
    from torchtitan.models.llama3 import llama3_args
    from torchtitan.train import Trainer

    llama3_args[args.preset] = titan_flavor(args.preset)
    c = JobConfig()
    c.job.dump_folder = workdir
    c.model.name, c.model.flavor, c.model.hf_assets_path = "llama3", args.preset, str(embedded_tokenizer_dir())
    c.optimizer.lr = args.lr
    c.lr_scheduler.warmup_steps = 1
    t = c.training
    t.dataset, t.local_batch_size, t.seq_len, t.steps = (
        _register_corpus(text_datasets),
        args.micro_batch_size,
        args.seq_len,
        args.steps,
    )
    t.mixed_precision_param = "bfloat16" if args.precision == "bf16" else "float32"
    c.metrics.log_freq = args.steps
    c.checkpoint.enable = False
    c.validation.enable = False
    c.activation_checkpoint.mode = "full" if args.activation_checkpointing else "none"
    c.compile.enable, c.compile.components = args.compile, ["model", "loss"]
    return Trainer(c)


# --- the run ---------------------------------------------------------------------------


def parameter_count(build: Any) -> int:
    with torch.device("meta"):
        model = build()
    return sum(p.numel() for p in model.parameters())


def check_shape(preset: str) -> None:
    """The parameter count torchtitan builds for the preset, next to the preset's own."""
    from fsdp_api.presets import PRESETS
    from torchtitan.models.llama3 import Transformer

    line: dict[str, Any] = {"preset": preset, "parameters": parameter_count(lambda: Transformer(titan_flavor(preset)))}
    d = PRESETS[preset]
    line["preset_parameters"] = d.num_params()
    line["untied_parameters"] = d.num_params() + (d.vocab_size * d.hidden_size if d.tie_word_embeddings else 0)
    print("SHAPE " + json.dumps(line), flush=True)


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", required=True, help="the trainer's preset whose shape torchtitan builds")
    p.add_argument("--precision", choices=["bf16", "fp32"], default="fp32")
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--micro-batch-size", type=int, default=8)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup-steps", type=int, default=3)
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--activation-checkpointing", action="store_true")
    p.add_argument("--compile", action="store_true")
    p.add_argument("--check-shape", action="store_true", help="print the parameter counts and stop")
    return p.parse_args()


def main() -> None:
    args = parse_args()
    require_release()
    _without_tensorboard()
    if not torch.cuda.is_available():
        _cpu_stand_ins()
    if args.check_shape:
        check_shape(args.preset)
        return
    import tempfile

    import torchtitan
    from torchtitan.tools.logging import init_logger
    from torchtitan.train import Trainer

    init_logger()
    # Each step's end, device synchronised: the window after the warm-up steps is timed, as the trainer's.
    marks: list[tuple[float, float]] = []
    train_step = Trainer.train_step

    def timed_step(self: Any, *a: Any, **kw: Any) -> Any:
        result = train_step(self, *a, **kw)
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        marks.append((time.perf_counter(), time.process_time()))
        return result

    Trainer.train_step = timed_step
    with tempfile.TemporaryDirectory(prefix="torchtitan-") as workdir:
        trainer = build_trainer(args, workdir)
        try:
            trainer.train()
        finally:
            trainer.close()
    if torch.cuda.is_available():
        peak_memory = torch.cuda.max_memory_allocated()
    else:
        peak_memory = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
    if rank == 0:
        (start, cpu_start), (end, cpu_end) = marks[args.warmup_steps - 1], marks[-1]
        result = {
            "steps": len(marks) - args.warmup_steps,
            "seconds": end - start,
            "cpu_seconds": cpu_end - cpu_start,
            "peak_memory_bytes": peak_memory,
            "torchtitan": torchtitan.__version__,
            "torch": torch.__version__,
            "logits": "full",  # the trainer's row to compare with
        }
        print("BENCH_RESULT " + json.dumps(result), flush=True)
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
