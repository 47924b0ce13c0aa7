"""One rank of a Hugging Face ``Trainer`` job with ``TrainingArguments(deepspeed=...)``, run on
the real DeepSpeed or on the bundled engine under the ``deepspeed`` import alias
(tests/test_hf_trainer.py starts it on 2 gloo ranks with tests/distributed.py:run_ranks).

Per ZeRO stage it trains a tiny model built from a config (no download) for 4 optimizer steps
with gradient accumulation 2, saving Trainer checkpoints at steps 2 and 4, evaluates, saves the
model, then resumes a new Trainer from the step-2 checkpoint and trains to step 4 again. Stage 2
trains ``GPT2LMHeadModel``; stage 3 trains ``LlamaForCausalLM`` with grouped-query attention and
tied embeddings, built under ``zero.Init`` (the Trainer's ZeRO-3 path).

``engine="alias-without-deepspeed"`` also makes the real package unimportable and its
distribution invisible before anything is imported, as if it were not installed, and reports
every module the job imported from the real package's folder (there must be none).
"""

from __future__ import annotations

import importlib.machinery
import importlib.metadata
import os
import sys
from pathlib import Path
from typing import Any

STEPS, ACCUMULATION, MICRO = 4, 2, 2


class _BlockRealDeepSpeed:
    """A meta-path finder after the alias: a ``deepspeed`` name the alias does not serve fails
    as it would without the package."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname == "deepspeed" or fullname.startswith("deepspeed."):
            raise ModuleNotFoundError(f"No module named {fullname!r}", name=fullname)
        return None


def _hide_real_deepspeed() -> None:
    sys.meta_path.insert(0, _BlockRealDeepSpeed())  # type: ignore[arg-type]
    find = importlib.machinery.PathFinder.find_distributions

    def without_deepspeed(*args: Any, **kwargs: Any) -> Any:
        return [
            d
            for d in find(*args, **kwargs)
            if (d.metadata["Name"] or "").replace("_", "-").lower() != "deepspeed"
        ]

    importlib.machinery.PathFinder.find_distributions = staticmethod(without_deepspeed)  # type: ignore[method-assign]


def _ds_config(stage: int) -> dict[str, Any]:
    """A ds_config as Hugging Face users write it: "auto" everywhere the Trainer fills in."""
    return {
        "train_micro_batch_size_per_gpu": "auto",
        "gradient_accumulation_steps": "auto",
        "train_batch_size": "auto",
        "gradient_clipping": "auto",
        "steps_per_print": 1000,
        "zero_optimization": {
            "stage": stage,
            "overlap_comm": True,
            "contiguous_gradients": True,
            "reduce_bucket_size": "auto",
            "stage3_prefetch_bucket_size": "auto",
            "stage3_param_persistence_threshold": "auto",
            "stage3_gather_16bit_weights_on_model_save": True,
        },
        "bf16": {"enabled": "auto"},
        "fp16": {"enabled": "auto"},
        "wall_clock_breakdown": False,
    }


def _model(stage: int) -> Any:
    import torch
    from transformers import AutoModelForCausalLM, GPT2Config, LlamaConfig

    torch.manual_seed(0)
    if stage == 3:
        config: Any = LlamaConfig(
            vocab_size=64,
            hidden_size=32,
            intermediate_size=48,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=32,
            tie_word_embeddings=True,
        )
    else:
        config = GPT2Config(
            vocab_size=64,
            n_positions=16,
            n_embd=32,
            n_layer=2,
            n_head=4,
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
        )
    return AutoModelForCausalLM.from_config(config)


def _data(n: int, seed: int) -> list[dict[str, Any]]:
    import torch

    g = torch.Generator().manual_seed(seed)
    return [{"input_ids": x, "labels": x} for x in torch.randint(0, 64, (n, 8), generator=g)]


def _trainer(stage: int, out: Path, max_steps: int) -> Any:
    from transformers import Trainer, TrainingArguments

    args = TrainingArguments(
        output_dir=str(out),
        per_device_train_batch_size=MICRO,
        per_device_eval_batch_size=MICRO,
        gradient_accumulation_steps=ACCUMULATION,
        max_steps=max_steps,
        learning_rate=3e-3,
        warmup_steps=1,
        weight_decay=0.01,
        max_grad_norm=0.5,
        logging_steps=1,
        save_steps=2,
        report_to=[],
        deepspeed=_ds_config(stage),
        use_cpu=True,
        seed=0,
        disable_tqdm=True,
    )
    model = _model(stage)  # after TrainingArguments: ZeRO-3 builds it under zero.Init
    return Trainer(model=model, args=args, train_dataset=_data(64, 1), eval_dataset=_data(8, 2))


def _reset_accelerate() -> None:
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(reset_partial_state=False)


def _weights(path: Path) -> dict[str, list[float]]:
    from safetensors.torch import load_file

    return {k: v.float().flatten().tolist() for k, v in sorted(load_file(path).items())}


def run(rank: int, world: int, engine: str, folder: str) -> dict[str, Any]:
    """The job on this rank; returns (rank 0) the logs, evaluation, saved weights, resumed logs
    and which files the checkpoints hold."""
    if engine == "alias-without-deepspeed":
        _hide_real_deepspeed()
    if engine.startswith("alias"):
        from zeroscope.engine.deepspeed.alias import install

        install()
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    import deepspeed

    deepspeed.init_distributed(dist_backend="gloo")
    out: dict[str, Any] = {"deepspeed_file": deepspeed.__file__}
    for stage in (2, 3):
        root = Path(folder) / f"stage{stage}"
        trainer = _trainer(stage, root, STEPS)
        trainer.train()
        evaluation = trainer.evaluate()
        trainer.save_model(str(root / "final"))
        logs = [e for e in trainer.state.log_history if "loss" in e]
        _reset_accelerate()
        resumed = _trainer(stage, root / "resumed", STEPS)
        resumed.train(resume_from_checkpoint=str(root / "checkpoint-2"))
        resumed_logs = [e for e in resumed.state.log_history if "loss" in e]
        _reset_accelerate()
        out[f"stage{stage}"] = {
            "logs": logs,
            "eval_loss": evaluation["eval_loss"],
            "weights": _weights(root / "final" / "model.safetensors") if rank == 0 else None,
            "resumed_logs": resumed_logs,
            "checkpoint": sorted(
                p.name for p in (root / "checkpoint-2" / "global_step2").iterdir()
            ),
        }
    out["real_deepspeed_modules"] = sorted(
        name
        for name, module in list(sys.modules.items())
        if f"site-packages{os.sep}deepspeed{os.sep}" in (getattr(module, "__file__", None) or "")
    )
    return out
