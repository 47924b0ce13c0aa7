"""What tests/test_launch_llama_factory.py runs LLaMA-Factory with: an interpreter that has it,
a tiny Llama built from a config with a word-level tokenizer, a local dataset
(``dataset_info.json``), DeepSpeed configs like LLaMA-Factory's own
(``examples/deepspeed/ds_z2_config.json``/``ds_z3_config.json``) and an SFT YAML like its
``examples/train_full`` ones.

LLaMA-Factory 0.9.5 pins ``transformers<=5.6.0`` and ``accelerate<=1.11.0`` and needs
``torchaudio``/``torchvision`` built for each torch release; this project's torch, transformers
and DeepSpeed must stay as they are. So it is installed without its dependencies, beside only
the light ones a text SFT imports (``datasets``, ``peft``, ``trl``, ``omegaconf``), which pip
resolves against the installed torch/transformers/accelerate without replacing them; where the
running interpreter lacks it, into a virtual environment layered on this one (a ``.pth`` file
naming this interpreter's site folders) in a cache folder.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import subprocess
import sys
import venv
from pathlib import Path

VERSION = "0.9.5"
LIGHT_DEPS = ["datasets>=2.16.0,<=4.0.0", "peft>=0.18.0,<=0.18.1", "trl>=0.18.0,<=0.24.0"]
LIGHT_DEPS.append("omegaconf")
KEPT = ("torch", "transformers", "deepspeed")

TORCHAUDIO_STAND_IN = '''"""A stand-in: no torchaudio build exists for this torch. LLaMA-Factory imports torchaudio when
its data module loads (for its audio plugin only, which a text SFT never calls)."""


def __getattr__(name):
    raise RuntimeError(f"torchaudio.{name}: torchaudio is a stand-in here (text-only runs)")
'''


def _versions(python: str) -> dict[str, str]:
    code = (
        "import importlib.metadata as m, json; "
        f"print(json.dumps({{n: m.version(n) for n in {list(KEPT)!r}}}))"
    )
    done = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=300)
    return json.loads(done.stdout.strip().splitlines()[-1]) if done.returncode == 0 else {}


def interpreter(cache: Path) -> tuple[str | None, str]:
    """(a Python that imports llamafactory, "") or (None, why it cannot be installed)."""
    if importlib.util.find_spec("llamafactory") is not None:
        return sys.executable, ""
    ours = _versions(sys.executable)
    # One venv per interpreter it layers on (and per version of what it must not move): the
    # cache outlives a test session, and a venv layered on another checkout's interpreter
    # reads that one's packages (a clean clone's newer transformers against an older tree's).
    key = hashlib.sha256(json.dumps([sys.prefix, ours], sort_keys=True).encode()).hexdigest()
    home = cache / f"llamafactory-{VERSION}-{key[:12]}"
    python = home / "bin" / "python"
    if not (home / "ready").is_file():
        venv.create(home, with_pip=True, clear=True)
        site = next((home / "lib").glob("python3*/site-packages"))
        here = [p for p in sys.path if p.endswith("site-packages") and Path(p).is_dir()]
        (site / "_layered_on_the_suite.pth").write_text("\n".join(here) + "\n")
        pip = [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
        for argv in ([*pip, "--no-deps", f"llamafactory=={VERSION}"], [*pip, *LIGHT_DEPS]):
            done = subprocess.run(argv, capture_output=True, text=True, timeout=1200)
            if done.returncode != 0:
                return None, f"pip could not install LLaMA-Factory: {done.stderr[-400:]}"
        (home / "ready").write_text("")
    theirs = _versions(str(python))
    if ours != theirs:  # a failure, not a skip: the install must never move these
        raise AssertionError(f"the LLaMA-Factory venv changed {KEPT}: {theirs} != {ours}")
    return str(python), ""


def build_inputs(tmp: Path) -> None:
    """The tiny model, tokenizer and dataset under ``tmp`` (model/, data/)."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    words = ["the", "a", "cat", "dog", "sat", "ran", "on", "mat", "log", "what", "did", "do"]
    specials = ["<unk>", "<s>", "</s>", "<pad>"]
    chars = [chr(c) for c in range(32, 127) if chr(c) not in words]
    vocab = {t: i for i, t in enumerate(specials + words + chars)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()  # type: ignore[assignment]
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="<unk>",
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
    )
    fast.save_pretrained(tmp / "model")
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(vocab), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
        bos_token_id=1, eos_token_id=2, pad_token_id=3,
    )  # fmt: skip
    LlamaForCausalLM(config).save_pretrained(tmp / "model")
    rows = [
        {"instruction": f"what did the {a} do", "input": "", "output": f"the {a} {b} on the {c}"}
        for a in ("cat", "dog")
        for b in ("sat", "ran")
        for c in ("mat", "log")
    ]
    (tmp / "data").mkdir()
    (tmp / "data" / "tiny.json").write_text(json.dumps(rows))
    (tmp / "data" / "dataset_info.json").write_text(
        json.dumps({"tiny": {"file_name": "tiny.json"}})
    )
    (tmp / "stand_in" / "torchaudio").mkdir(parents=True)
    (tmp / "stand_in" / "torchaudio" / "__init__.py").write_text(TORCHAUDIO_STAND_IN)


_AUTO_PRECISION = {
    "fp16": {
        "enabled": "auto", "loss_scale": 0, "loss_scale_window": 1000,
        "initial_scale_power": 16, "hysteresis": 2, "min_loss_scale": 1,
    },
    "bf16": {"enabled": "auto"},
}  # fmt: skip
ZERO: dict[int, dict[str, object]] = {
    2: {
        "stage": 2, "allgather_partitions": True, "allgather_bucket_size": 5e8,
        "overlap_comm": False, "reduce_scatter": True, "reduce_bucket_size": 5e8,
        "contiguous_gradients": True, "round_robin_gradients": True,
    },
    3: {
        "stage": 3, "overlap_comm": False, "contiguous_gradients": True, "sub_group_size": 1e9,
        "reduce_bucket_size": "auto", "stage3_prefetch_bucket_size": "auto",
        "stage3_param_persistence_threshold": "auto", "stage3_max_live_parameters": 1e9,
        "stage3_max_reuse_distance": 1e9, "stage3_gather_16bit_weights_on_model_save": True,
    },
}  # fmt: skip


def ds_config(stage: int) -> dict[str, object]:
    """LLaMA-Factory's examples/deepspeed/ds_z{2,3}_config.json (the Trainer fills the autos)."""
    return {
        "train_batch_size": "auto",
        "train_micro_batch_size_per_gpu": "auto",
        "gradient_accumulation_steps": "auto",
        "gradient_clipping": "auto",
        "zero_allow_untested_optimizer": True,
        **_AUTO_PRECISION,
        "zero_optimization": ZERO[stage],
    }


def sft_yaml(tmp: Path, stage: int, output_dir: Path, steps: int) -> str:
    """An examples/train_full-like YAML, small: full SFT of the tiny model, ``steps`` steps."""
    (tmp / f"ds_z{stage}_config.json").write_text(json.dumps(ds_config(stage)))
    return "\n".join(
        [
            f"model_name_or_path: {tmp / 'model'}",
            "stage: sft",
            "do_train: true",
            "finetuning_type: full",
            f"deepspeed: {tmp / f'ds_z{stage}_config.json'}",
            "dataset: tiny",
            f"dataset_dir: {tmp / 'data'}",
            "template: default",
            "cutoff_len: 64",
            "overwrite_cache: true",
            "preprocessing_num_workers: 1",
            "dataloader_num_workers: 0",
            f"output_dir: {output_dir}",
            "logging_steps: 1",
            'save_strategy: "no"',
            "overwrite_output_dir: true",
            "report_to: none",
            "per_device_train_batch_size: 2",
            "gradient_accumulation_steps: 1",
            "learning_rate: 1.0e-3",
            f"max_steps: {steps}",
            "lr_scheduler_type: constant",
            "seed: 0",
            # LLaMA-Factory's own checkpointing wrapper fails on this transformers
            "disable_gradient_checkpointing: true",
            # CPU ranks (accelerate's multi-CPU state, gloo)
            "use_cpu: true",
        ]
    )


def environment(tmp: Path, python: str, root: Path) -> dict[str, str]:
    """The runs' environment: a ``torchrun`` on PATH for this interpreter (LLaMA-Factory's CLI
    runs the command ``torchrun``), the torchaudio stand-in, 2 CPU ranks."""
    bin_dir = tmp / "bin"
    bin_dir.mkdir(exist_ok=True)
    torchrun = bin_dir / "torchrun"
    torchrun.write_text(
        f"#!{python}\nimport sys\nfrom torch.distributed.run import main\nsys.exit(main())\n"
    )
    torchrun.chmod(0o755)
    env = dict(os.environ)
    env.update(
        PATH=os.pathsep.join([str(bin_dir), env.get("PATH", "")]),
        PYTHONPATH=os.pathsep.join([str(tmp / "stand_in"), str(root)]),
        DISABLE_VERSION_CHECK="1",
        DS_ACCELERATOR="cpu",
        OMP_NUM_THREADS="1",
        TOKENIZERS_PARALLELISM="false",
    )
    env.setdefault("TORCH_EXTENSIONS_DIR", str(Path(sys.prefix) / "torch-extensions"))
    return env
